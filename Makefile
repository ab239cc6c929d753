# Every target bootstraps what it needs: a fresh clone needs only Python 3.13, Java 17 and Node 20.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV    := .venv
BIN     := $(abspath $(VENV))/bin
STAMP   := $(VENV)/.installed
NODE_STAMP := tools/local/node_modules/.installed
# AWS's IAM policy evaluation the unit tests decide every call with (tools/iam/README.md).
IAM_STAMP  := tools/iam/node_modules/.installed
export PATH := $(BIN):$(PATH)
export SAM_CLI_TELEMETRY := 0
export PYTHONDONTWRITEBYTECODE := 1
# A region for what runs on this machine alone and reaches no account (the local stack, the tests, the
# benchmarks and chaos runs, the docs' screenshot, lint's sam validate): unless the shell sets one. Never
# for what talks to a real account (deploy, test-e2e, the operator commands): botocore puts
# AWS_DEFAULT_REGION ahead of the profile's region, so it would send them to this region whatever the
# profile says. make test runs the e2e tests too: it sets it only without STACK_NAME (they are skipped then).
LOCAL_REGION := us-east-1
LOCAL_ONLY   := lint build test-unit test-integration test-conformance local invoke bench bench-capacity \
                chaos chaos-isolation chaos-scenarios fuzz mutation docs
$(LOCAL_ONLY): export AWS_DEFAULT_REGION ?= $(LOCAL_REGION)
ifndef STACK_NAME
test: export AWS_DEFAULT_REGION ?= $(LOCAL_REGION)
endif

FUNCTIONS := $(wildcard functions/*)
# The browser the local inspector's tests and make docs' screenshot drive (Playwright, never its own download).
CHROMIUM  ?= /usr/bin/chromium
export CHROMIUM
PYTEST    := $(BIN)/pytest
# The tools' own unit tests, next to what they test; they run with the product's (test-unit, test).
TOOL_TESTS := tools/local/tests tools/docs/tests tools/bench/tests tools/artefacts/tests tools/iam/tests

# Scanners get their own venv: checkov's boto3 pin conflicts with aws-sam-cli's (requirements-scan.txt).
SCAN_VENV  := .venv-scan
SCAN_BIN   := $(abspath $(SCAN_VENV))/bin
SCAN_STAMP := $(SCAN_VENV)/.installed
# checkov does not apply AWS::LanguageExtensions: it scans the template as SAM CLI's processors read it
# (tools/template/expand.py), and the nested template of the order database (OrderStore=postgres) as written, with the settings and
# the reasoned skips of .checkov.yaml.
EXPANDED   := .aws-sam/expanded/template.json
NESTED     := nested/order-database.yaml
CHECKOV    := $(BIN)/python -m tools.template.expand template.yaml $(EXPANDED) && \
              $(SCAN_BIN)/checkov --config-file .checkov.yaml --file $(EXPANDED) --file $(NESTED)
# What the functions ship: the shared layer and each function's own requirements.
AUDITED    := layers/shared/requirements.txt $(wildcard functions/*/requirements.txt)
# pypi (PyPI's per-version JSON API) or osv (api.osv.dev). To accept a finding, add
# --ignore-vuln <ID> here with a comment saying why it does not apply.
AUDIT_ARGS := --vulnerability-service $(or $(AUDIT_SERVICE),pypi)

.PHONY: help install lint scan audit template build browser test test-unit test-conformance test-integration test-e2e deploy local invoke clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

# The stamps' recipes, one for each kind, so that both venvs and both Node folders are made alike (the
# target is the stamp). A venv at $(1), its bin $(2), made with Python 3.13 and the requirements file the
# rule names first. uv installs it from the same pins, fetched in parallel: both venvs in about 50 s where
# pip took 150 on a fresh clone. Bytecode is compiled as pip does, since every function process imports
# from it; certificates come from the machine's own store, as pip's do (a proxy's CA lives there).
UV_VERSION := 0.13.9
define python-venv
@py=$$(scripts/find-python313); echo "creating $(1) with $$py"; \
  rm -rf $(1); "$$py" -m venv $(1)
$(2)/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)
$(2)/uv pip install --quiet --system-certs --compile-bytecode --python $(2)/python -r $<
@touch $@
endef
# The locked Node packages of folder $(1), which $(2) needs.
define npm-packages
@command -v npm >/dev/null || { echo "error: npm (Node 20) is required for $(2)"; exit 1; }
cd $(1) && npm ci --silent --no-audit --no-fund
@touch $@
endef

$(STAMP): requirements-dev.txt scripts/find-python313
	$(call python-venv,$(VENV),$(BIN))

$(NODE_STAMP): tools/local/package.json tools/local/package-lock.json
	$(call npm-packages,tools/local,DynamoDB Local)

$(SCAN_STAMP): requirements-scan.txt scripts/find-python313
	$(call python-venv,$(SCAN_VENV),$(SCAN_BIN))

$(IAM_STAMP): tools/iam/package.json tools/iam/package-lock.json
	$(call npm-packages,tools/iam,the IAM evaluation (tools/iam))

install: $(STAMP) $(NODE_STAMP) $(IAM_STAMP) ## create .venv (python3.13) and install pinned dev deps, DynamoDB Local and the IAM simulator

lint: $(STAMP) $(SCAN_STAMP) ## ruff, mypy, cfn-lint, sam validate --lint, checkov
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy layers/shared/shop operations tools tests
	@for f in $(FUNCTIONS); do echo "mypy $$f"; MYPYPATH=layers/shared:$$f $(BIN)/mypy $$f/app.py; done
	$(BIN)/cfn-lint template.yaml $(NESTED)
	$(BIN)/sam validate --lint --template template.yaml
	$(CHECKOV)

scan: $(STAMP) $(SCAN_STAMP) ## checkov on the expanded template.yaml: no failed check; every skip is in .checkov.yaml, with its reason
	$(CHECKOV)

# Not part of lint: it needs vulnerability data from PyPI's per-version JSON API or from OSV, and
# fails (never skips) when it cannot get it. --strict turns "could not audit" into a failure.
audit: $(SCAN_STAMP) ## pip-audit of the shared layer and function requirements (needs PyPI JSON API or OSV)
	@for r in $(AUDITED); do \
	  echo "pip-audit $(AUDIT_ARGS) -r $$r"; \
	  $(SCAN_BIN)/pip-audit --strict --progress-spinner off $(AUDIT_ARGS) -r "$$r" || { \
	    echo "error: $$r failed the audit: a known vulnerability (listed above), or no vulnerability data"; \
	    echo "  (\"Dependency not found on PyPI\" means https://pypi.org/pypi/<name>/<version>/json is"; \
	    echo "  unreachable from here; try AUDIT_SERVICE=osv where api.osv.dev is reachable)"; exit 1; }; \
	done

template: $(STAMP) ## write template.yaml out from template.source.yaml (its Fn::ForEach loops expanded: tools/template/generate.py)
	$(BIN)/python -m tools.template.generate

build: $(STAMP) ## sam build (no Docker)
	$(BIN)/sam build --template template.yaml --cached --parallel

# Chromium from the OS packages (Debian: the chromium package; Playwright's own browser download needs the
# internet). Installed when this runs as root with apt-get (CI's fresh machine); elsewhere it says how, and
# the browser tests are skipped with that reason printed. A failed apt-get install is a note, not a failure:
# the rest of make test still runs (the browser tests then skip and say why). Except in CI (CI=true, as CI
# services set it): there, no Chromium after the attempt to install it fails, as the browser tests would
# (tools/local/inspector/browser.py, browser_tests_gate): a CI run never passes with them skipped.
browser: ## headless Chromium for the inspector's browser tests and make docs (apt-get install chromium, as root); CI=true: required
	@if [ -x "$(CHROMIUM)" ]; then echo "browser: $$("$(CHROMIUM)" --version 2>/dev/null || echo "$(CHROMIUM)")"; \
	elif [ "$(CHROMIUM)" = /usr/bin/chromium ] && command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  echo "installing chromium from the OS packages (apt-get)"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium \
	    >/dev/null && echo "browser: $$(/usr/bin/chromium --version 2>/dev/null)"; } \
	  || echo "note: apt-get install chromium failed: the browser tests will be skipped, saying why"; \
	else \
	  echo "note: no Chromium at $(CHROMIUM), and it cannot be installed here (needs apt-get as root): the"; \
	  echo "  browser tests will be skipped; install it (Debian: apt-get install chromium) or set CHROMIUM=<path>"; \
	fi
	@case "$$(printf '%s' "$${CI:-}" | tr '[:upper:]' '[:lower:]')" in true|1|yes) \
	  if [ ! -x "$(CHROMIUM)" ]; then \
	    echo "error: CI=$${CI:-} and no Chromium at $(CHROMIUM), even after trying to install it: in CI the inspector's"; \
	    echo "  browser tests must run (install chromium on the CI machine, or set CHROMIUM=<path>)"; exit 1; \
	  fi;; \
	esac

test-unit: $(STAMP) $(IAM_STAMP) ## unit tests (moto, no network), the product's and the tools'
	$(PYTEST) tests/unit $(TOOL_TESTS)

test-integration: $(STAMP) $(NODE_STAMP) build ## integration tests against DynamoDB Local and the build output
	$(PYTEST) tests/integration

test-conformance: $(STAMP) $(NODE_STAMP) ## the local stack against AWS's documented behaviour (tests/conformance)
	$(PYTEST) tests/conformance

test-e2e: $(STAMP) ## tests against a deployed stack (skipped without AWS credentials)
	$(PYTEST) tests/e2e

# One pytest session over every suite, so the run's closing line counts every test (CI reads it);
# test-unit / test-conformance / test-integration / test-e2e remain for running one layer.
# Two pytest-xdist workers: most of the suite's time is stacks waiting on timers (visibility timeouts,
# retries, a database restart), which a second worker fills; worksteal evens out the long chaos tests.
TEST_WORKERS ?= 2
test: lint build browser $(NODE_STAMP) $(IAM_STAMP) ## everything CI checks: lint, then unit, conformance, integration and e2e tests in one pytest session (TEST_WORKERS=2)
	$(PYTEST) --numprocesses=$(TEST_WORKERS) --dist=worksteal tests/unit $(TOOL_TESTS) tests/conformance tests/integration tests/e2e

deploy: build ## sam deploy (uses samconfig.toml; add ARGS=--guided the first time)
	$(BIN)/sam deploy $(ARGS)

# make local and make bench run one long-lived stack: DynamoDB Local's JVM compiles fully (C2) for
# throughput. The tests start many short-lived stacks and keep the start-up default (C1 only, half the
# start-up CPU; tools/local/services/emulators.py). docs/performance.md has both measured.
local bench bench-capacity: export LOCAL_DYNAMODB_JVM_OPTIONS ?= -XX:+UseSerialGC

local: $(STAMP) $(NODE_STAMP) ## the whole pipeline on this machine, no Docker (PORT=3000, PERSIST=1, LOGS=1)
	@command -v java >/dev/null || { echo "error: Java 17+ is required for DynamoDB Local (e.g. apt-get install openjdk-17-jre-headless)"; exit 1; }
	PYTHONPATH=layers/shared $(BIN)/python -m tools.local

invoke: $(STAMP) $(NODE_STAMP) ## run one function: make invoke FUNCTION=<LogicalId> EVENT=events/<file>.json (ORDER_STORE= POSTGRES_RELAY= as make local)
	@test -n "$(FUNCTION)" -a -n "$(EVENT)" || { echo "usage: make invoke FUNCTION=<LogicalId> EVENT=events/<file>.json"; exit 2; }
	PYTHONPATH=layers/shared $(BIN)/python -m tools.local invoke "$(FUNCTION)" "$(EVENT)"

clean: ## remove build output and caches (keeps .venv and .venv-scan)
	rm -rf .aws-sam .pytest_cache .mypy_cache .ruff_cache

# --- operations (docs/operations.md) -----------------------------------------------------------------
# STACK=<stack name> for a deployed stack; LOCAL=1 for the running make local (the one on PORT): one of
# them, or the target says so (the command alone would ask for its own options, --stack-name or --local).
ADMIN := $(BIN)/python -m operations $(if $(STACK),--stack-name $(STACK)) $(if $(LOCAL),--local)
define need-stack
@test -n "$(STACK)$(LOCAL)" || { echo "usage: make $@ $(1)STACK=<stack name> (or LOCAL=1 for the running make local)"; exit 2; }
endef

.PHONY: redrive redrive-dlq redrive-poison replay seed
redrive: $(STAMP) ## republish the batches in the relay DLQ (STACK=<stack name> or LOCAL=1)
	$(call need-stack)
	$(ADMIN) redrive

redrive-dlq: $(STAMP) ## move a consumer's DLQ back to its queue (CONSUMER=Inventory|OrderStatus|Notification; STACK= or LOCAL=1; INCLUDE_EXPIRED=1 past the consumers' memory)
	@test -n "$(CONSUMER)" || { echo "usage: make redrive-dlq CONSUMER=Inventory|OrderStatus|Notification STACK=<stack name> (or LOCAL=1)"; exit 2; }
	$(call need-stack,CONSUMER=$(CONSUMER) )
	$(ADMIN) redrive-dlq --consumer $(CONSUMER) $(if $(INCLUDE_EXPIRED),--include-expired)

redrive-poison: $(STAMP) ## republish records the relay parked, once they decode (STACK=<stack name> or LOCAL=1)
	$(call need-stack)
	$(ADMIN) redrive-poison

replay: $(STAMP) ## republish outbox events of every outbox table (STACK= or LOCAL=1; FROM= TO= or EVENT_ID=; TABLE= one table only; INCLUDE_EXPIRED=1 past expiresAt)
	$(call need-stack)
	$(ADMIN) replay $(if $(FROM),--from $(FROM)) $(if $(TO),--to $(TO)) $(if $(EVENT_ID),--event-id $(EVENT_ID)) \
	  $(if $(TABLE),--table $(TABLE)) \
	  $(if $(INCLUDE_EXPIRED),--include-expired)

seed: $(STAMP) ## set stock levels from tools/local/seed.json (STACK=<stack name> or LOCAL=1)
	$(call need-stack)
	$(ADMIN) seed --file tools/local/seed.json

# --- benchmarks (docs/performance.md) ----------------------------------------------------------------
.PHONY: bench bench-capacity
bench: $(STAMP) $(NODE_STAMP) ## relay efficiency, latency, cold start and write cost -> .bench/latest.json
	PYTHONPATH=layers/shared $(BIN)/python -m tools.bench

# Not part of make bench: the local stack is built for fidelity to AWS, not throughput (docs/performance.md).
bench-capacity: $(STAMP) $(NODE_STAMP) ## report only: the local stack's saga capacity (a ramp of offered rates, CPU per order) -> .bench/capacity.json
	BENCH_PARTS=capacity BENCH_REPORT=capacity.json PYTHONPATH=layers/shared $(BIN)/python -m tools.bench

# --- fault injection (docs/guarantees.md) ------------------------------------------------------------
# Settings are environment variables read by tools/chaos/__main__.py; make puts the ones given on its
# command line (make chaos ORDER_STORE=postgres POSTGRES_RELAY=logical ORDERS=2000) in the recipe's
# environment, as it does those set before it (ORDER_STORE=postgres make chaos).
.PHONY: chaos
chaos: $(STAMP) $(NODE_STAMP) ## faults at every boundary, invariants checked (ORDERS=200 SEED=7 ORDER_STORE=dynamodb|postgres POSTGRES_RELAY=polling|logical) -> .chaos/latest.json
	PYTHONPATH=layers/shared $(BIN)/python -m tools.chaos

.PHONY: chaos-isolation
chaos-isolation: $(STAMP) $(NODE_STAMP) ## one poison among RECORDS=1000 on the stream and on a queue, measured -> .chaos/isolation.json
	PYTHONPATH=layers/shared $(BIN)/python -m tools.chaos isolation

.PHONY: fuzz
fuzz: $(STAMP) $(NODE_STAMP) ## schemathesis: REQUESTS=1000 generated requests against the local API -> .chaos/fuzz.json
	PYTHONPATH=layers/shared $(BIN)/python -m tools.chaos fuzz

# --- mutation testing (docs/testing.md) ---
# mutmut names a mutant after its file's path and needs the tests to import the module by that name;
# they import the shared layer as `shop` (pytest pythonpath), so mutmut runs in MUTATION_DIR, where
# shop/ and what the tests read are linked at the top ([tool.mutmut] in pyproject.toml). Each run
# starts afresh. Survivors are the mutants no unit test fails on: "survived" and "no tests".
# Every module of [tool.mutmut] only_mutate gets mutants; by default the order and inventory
# transactions, the consumers' idempotency and the recovery commands are tested. The five product
# modules take about 20 minutes on 2 cores; the recovery commands over an hour more (their tests drive
# the CLI on moto: a few mutants a minute), so a quick run names its modules: MUTANTS="'shop.domain.orders.*'".
# `make mutation MUTANTS=` tests all of them (adapters/dynamodb/outbox_items too: most relay and recovery tests
# read an outbox item, so each of its mutants runs them all).
MUTANTS         ?= 'shop.adapters.dynamodb.order_repository.*' 'shop.domain.orders.*' 'shop.runtime.consumer.*' \
                   'shop.adapters.dynamodb.inventory_repository.*' 'shop.domain.inventory.*' \
                   'operations.recovery.*' 'operations.admin.*' 'operations.stack.*'
MUTATION_DIR    := .mutation
MUTATION_LINKS  := tests tools operations functions events nested template.yaml pyproject.toml
# Survivors allowed per module (module, tab, count): a change that lets one more mutant survive in a
# module fails the target; lower a count when tests kill more.
MUTATION_BUDGETS := tests/mutation_budget.tsv
MUTATION_JOBS   ?= 2
# mutmut 3.7 reads Item._nodeid, which pytest 9 renamed nodeid (mutmut 3.8.1 reads nodeid, but needs
# click >= 8.4, which aws-sam-cli's click pin forbids). It runs pytest in its own process: alias it there.
MUTMUT := $(BIN)/python -c 'import _pytest.nodes as n; n.Node._nodeid = property(lambda node: node.nodeid); from mutmut.__main__ import cli; cli()'

.PHONY: mutation
mutation: $(STAMP) $(IAM_STAMP) ## mutmut over the guarantee-bearing modules; fails when a module has more survivors than tests/mutation_budget.tsv allows
	rm -rf $(MUTATION_DIR) && mkdir -p $(MUTATION_DIR)
	ln -s ../layers/shared/shop $(MUTATION_DIR)/shop
	for p in $(MUTATION_LINKS); do ln -s ../$$p $(MUTATION_DIR)/$$p; done
	@echo "mutmut run ($(MUTATION_JOBS) workers; progress in $(MUTATION_DIR)/run.log)"
	@cd $(MUTATION_DIR) && $(MUTMUT) run --max-children $(MUTATION_JOBS) $(MUTANTS) > run.log 2>&1 || { \
	  tr '\r' '\n' < run.log | tail -40; echo "error: mutmut could not run (see $(MUTATION_DIR)/run.log)"; exit 1; }
	@tr '\r' '\n' < $(MUTATION_DIR)/run.log | grep 'mutations/second' || true
	@$(MAKE) --no-print-directory mutation-report

.PHONY: mutation-report
mutation-report: $(STAMP) ## the last `make mutation` run's survivors per module against tests/mutation_budget.tsv
	@cd $(MUTATION_DIR) && $(MUTMUT) results --all true \
	  | sed -E 's/^ *(.*)\.[^.]*__mutmut_[0-9]+: (.*)$$/\1\t\2/' > results.tsv
	@echo "survivors (inspect one: cd $(MUTATION_DIR) && ../$(VENV)/bin/mutmut show <name>):"
	@cd $(MUTATION_DIR) && $(MUTMUT) results | sed -nE 's/^ *(.*): (survived|no tests)$$/  \1 (\2)/p'
	@awk -F'\t' ' \
	  FNR == NR { if ($$1 !~ /^#/ && NF == 2) cap[$$1] = $$2; next } \
	  $$2 != "not checked" { total[$$1]++; count[$$1, $$2]++; all[$$2]++ } \
	  END { \
	    printf "%-34s %9s %7s %9s %9s %8s %6s %7s\n", "module", "generated", "killed", "survived", "no tests", \
	      "timeout", "other", "budget"; \
	    for (m in total) { \
	      other = total[m] - count[m, "killed"] - count[m, "survived"] - count[m, "no tests"] - count[m, "timeout"]; \
	      left = count[m, "survived"] + count[m, "no tests"]; \
	      printf "%-34s %9d %7d %9d %9d %8d %6d %7s\n", m, total[m], count[m, "killed"], count[m, "survived"], \
	        count[m, "no tests"], count[m, "timeout"], other, (m in cap) ? cap[m] : "none"; \
	      if ((m in cap) && left > cap[m]) { over = over " " m }; \
	      n += total[m] } \
	    printf "%d mutants, %d killed, %d survivors\n", n, all["killed"], all["survived"] + all["no tests"]; \
	    if (n == 0) { print "error: no mutants were tested"; exit 1 } \
	    if (over != "") { print "error: more survivors than the budget (" BUDGETS "):" over; exit 1 } }' \
	  BUDGETS=$(MUTATION_BUDGETS) $(MUTATION_BUDGETS) $(MUTATION_DIR)/results.tsv

# --- recovery scenarios (tools/chaos/recovery_scenarios.py) -------------------------------------------------
.PHONY: chaos-scenarios
chaos-scenarios: $(STAMP) $(NODE_STAMP) ## poison in a full batch of 100, a redrive older than the TTL, redrive-poison while the bus refuses, 100 orders on one hot SKU, a 2-day replay after a chaos run (ORDERS=100) -> .chaos/<name>.json
	PYTHONPATH=layers/shared $(BIN)/python -m tools.chaos full-batch
	PYTHONPATH=layers/shared $(BIN)/python -m tools.chaos stale-redrive
	PYTHONPATH=layers/shared $(BIN)/python -m tools.chaos rejected-redrive
	PYTHONPATH=layers/shared $(BIN)/python -m tools.chaos hot-sku
	PYTHONPATH=layers/shared $(BIN)/python -m tools.chaos replay

# --- generated docs (tools/docs) -----------------------------------------------------------------------
.PHONY: docs
# The inspector's screenshot comes from a local stack of its own (DynamoDB Local: Java and npm) in headless
# Chromium (make browser); it fails, saying why, where Chromium is missing.
docs: $(STAMP) $(NODE_STAMP) browser ## regenerate reference tables, events table, docs/asyncapi.yaml, docs/order-database.sql and the inspector's screenshots (docs/images/inspector*.png)
	PYTHONPATH=layers/shared $(BIN)/python -m tools.docs
	PYTHONPATH=layers/shared $(BIN)/python -m tools.docs.database_schema
	PYTHONPATH=layers/shared $(BIN)/python -m tools.docs.inspector_screenshot docs/images/inspector.png
