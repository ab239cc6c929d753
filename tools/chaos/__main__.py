"""`make chaos` (python -m tools.chaos): one chaos run; a live line while it runs (tools/chaos/progress.py),
then prints the table, writes .chaos/latest.json and its chart .chaos/latest.png (tools/chaos/chart.py).
`make chaos-isolation` (python -m tools.chaos isolation): the poison-pill isolation measurement
(RECORDS=1000),
writes .chaos/isolation.json.
`make fuzz` (python -m tools.chaos fuzz): schemathesis against the local stack's API (REQUESTS=1000, SEED=7),
writes .chaos/fuzz.json.
Recovery scenarios (tools/chaos/recovery_scenarios.py), each writes .chaos/<name>.json:
    `python -m tools.chaos full-batch`     one poison at position 3 of a full relay batch of 100
    `python -m tools.chaos stale-redrive`  redrive refuses a DLQ batch older than the outbox TTL
    `python -m tools.chaos rejected-redrive` redrive-poison while the bus still refuses the record
    `python -m tools.chaos hot-sku`        a chaos run (ORDERS=100) on one SKU, its transactions in conflict
    `python -m tools.chaos replay`         a chaos run (ORDERS=100), then a 2-day replay of both tables

Settings from the environment, as the Makefile passes them:
    ORDERS=200        orders to place
    SEED=7            seed of every random decision (faults, orders, duplicates)
    WORKERS=6         concurrent HTTP clients
    RATE=4            orders created per second at most (0: as fast as the clients go)
    DRAIN_TIMEOUT=    seconds to wait for the pipeline to drain (default: max(240, 0.6 x ORDERS), twice that
                      with the relay operations; a drain with outbox events missing from the bus and
                      none arriving for 300 s gives up early)
    MAX_RECEIVES=     the consumer queues' maxReceiveCount (default: the template's)
    PARALLELIZATION=  the relay mappings' ParallelizationFactor (default: the template's, 1)
    ORDER_STORE=dynamodb  the template's OrderStore: dynamodb, or postgres (orders in PostgreSQL, the
                      polling publisher: 2 then 4 publishers at once, the database restarted mid-drive,
                      poison rows; tools/chaos/harness.py)
    POSTGRES_RELAY=polling  with ORDER_STORE=postgres, the template's PostgresRelay: polling, or logical
                      (the publisher reads a replication slot; it also crashes after a slot advance,
                      and the slot must end empty; and the relay's operations run mid-drive: replays
                      of everything written so far at 70 % and 97 % of the orders, a switch to polling
                      at 72 % (once half of the first replay's set is out) and back at 80 %,
                      tools/chaos/relay_operations.py); refused without ORDER_STORE=postgres
    RELAY_OPERATIONS=  with ORDER_STORE=postgres: 1 runs the relay's operations (the replays and the
                      switches) whatever the relay, 0 never (default: with the logical relay)
Exit status: 0 when every invariant holds, 1 when one fails, 2 when the run could not be made.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from tools.chaos import (
    fuzz,
    recovery_after_chaos,
    recovery_full_batch,
    recovery_redrive,
    recovery_scenarios,
)
from tools.chaos.config import (
    DEFAULT_OUT_DIR,
    DYNAMODB,
    ORDER_STORES,
    POLLING,
    POSTGRES,
    ChaosConfig,
    postgres_relays,
)
from tools.chaos.harness import run
from tools.chaos.isolation import Isolation
from tools.chaos.isolation import render as render_isolation
from tools.chaos.report import render, save
from tools.local.processes import StartupError


def _env_int(name: str, default: int | None) -> int | None:
    raw = os.environ.get(name, "")
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise SystemExit(f"error: {name} must be an integer, got {raw!r}") from None


def _order_store() -> str:
    store = os.environ.get("ORDER_STORE", "").strip().lower() or DYNAMODB
    if store not in ORDER_STORES:
        raise SystemExit(f"error: ORDER_STORE must be one of {', '.join(ORDER_STORES)}, got {store!r}")
    return store


def _postgres_relay(store: str) -> str:
    """POSTGRES_RELAY, one of the template's PostgresRelay values; only with ORDER_STORE=postgres."""
    relay = os.environ.get("POSTGRES_RELAY", "").strip().lower() or POLLING
    allowed = postgres_relays()
    if relay not in allowed:
        raise SystemExit(f"error: POSTGRES_RELAY must be one of {', '.join(allowed)}, got {relay!r}")
    if relay != POLLING and store != POSTGRES:
        raise SystemExit(
            f"error: POSTGRES_RELAY={relay} needs ORDER_STORE=postgres (it chooses how the PostgreSQL "
            f"outbox reaches the bus; ORDER_STORE is {store})"
        )
    return relay


def config_from_env(orders: int = 200, *, order_store: bool = True) -> ChaosConfig:
    """The run's settings; without `order_store`, neither ORDER_STORE nor POSTGRES_RELAY is read (the
    scenarios are DynamoDB's)."""
    drain = _env_int("DRAIN_TIMEOUT", None)
    store = _order_store() if order_store else DYNAMODB
    return ChaosConfig(
        orders=_env_int("ORDERS", orders) or orders,
        seed=_env_int("SEED", 7) or 0,
        workers=_env_int("WORKERS", 6) or 6,
        rate=float(_env_int("RATE", 4) or 0) or None,
        drain_timeout_seconds=float(drain) if drain else None,
        max_receive_count=_env_int("MAX_RECEIVES", None),
        parallelization_factor=_env_int("PARALLELIZATION", None),
        order_store=store,
        postgres_relay=_postgres_relay(store) if order_store else POLLING,
        relay_operations=_relay_operations(),
    )


def _relay_operations() -> bool | None:
    """RELAY_OPERATIONS: 1 or 0; unset, the harness's default (with the logical relay)."""
    raw = os.environ.get("RELAY_OPERATIONS", "").strip()
    if raw not in ("", "0", "1"):
        raise SystemExit(f"error: RELAY_OPERATIONS must be 0 or 1, got {raw!r}")
    return None if raw == "" else raw == "1"


def isolation() -> int:
    records = _env_int("RECORDS", 1000) or 1000
    try:
        report = Isolation(records, DEFAULT_OUT_DIR).run()
    except (StartupError, RuntimeError, TimeoutError) as exc:
        print(f"error: the isolation measurement could not be made: {exc}", file=sys.stderr)
        return 2
    DEFAULT_OUT_DIR.mkdir(parents=True, exist_ok=True)
    (DEFAULT_OUT_DIR / "isolation.json").write_text(json.dumps(report, indent=2) + "\n")
    print(render_isolation(report))
    return 0 if report["passed"] else 1


def fuzz_api() -> int:
    total = _env_int("REQUESTS", 1000) or 1000
    try:
        report = fuzz.run_against_local_stack(total, _env_int("SEED", 7) or 0)
    except StartupError as exc:
        print(f"error: the local stack could not start: {exc}", file=sys.stderr)
        return 2
    DEFAULT_OUT_DIR.mkdir(parents=True, exist_ok=True)
    (DEFAULT_OUT_DIR / "fuzz.json").write_text(json.dumps(report, indent=2) + "\n")
    print(fuzz.render(report))
    return 0 if report["passed"] else 1


def _write(name: str, report: dict[str, Any]) -> None:
    """.chaos/<name>.json, and beside it .chaos/<name>.png when the report is a chaos run's (its timeline)."""
    save(report, DEFAULT_OUT_DIR / f"{name}.json")


def scenario(name: str) -> int:
    """One recovery scenario: 0 when its expectation holds, 1 when not, 2 when it could not be made."""
    try:
        if name == "hot-sku":
            report = recovery_after_chaos.hot_sku(config_from_env(orders=100, order_store=False))
            _write(name, report)
            print(render(report))
            return 0 if report["passed"] else 1
        if name == "replay":
            report = recovery_after_chaos.replay_after_chaos(config_from_env(orders=100, order_store=False))
            _write(name, report)
            print(render(report))
            return 0 if report["passed"] else 1
        runner = {
            "full-batch": recovery_full_batch.FullBatchPoison,
            "stale-redrive": recovery_redrive.StaleRedrive,
            "rejected-redrive": recovery_redrive.RejectedRedrive,
        }
        report = runner[name](DEFAULT_OUT_DIR).run()
    except (StartupError, RuntimeError, TimeoutError) as exc:
        print(f"error: the {name} scenario could not be made: {exc}", file=sys.stderr)
        return 2
    _write(name, report)
    print(recovery_scenarios.render(report))
    return 0 if report["passed"] else 1


SCENARIOS = ("full-batch", "stale-redrive", "rejected-redrive", "hot-sku", "replay")


def main(argv: list[str]) -> int:
    if argv[1:] == ["isolation"]:
        return isolation()
    if len(argv) == 2 and argv[1] in SCENARIOS:
        return scenario(argv[1])
    if argv[1:] == ["fuzz"]:
        return fuzz_api()
    if argv[1:]:
        print(
            f"usage: python -m tools.chaos [isolation | fuzz | {' | '.join(SCENARIOS)}]",
            file=sys.stderr,
        )
        return 2
    config = config_from_env()
    try:
        report = run(config)
    except (StartupError, RuntimeError) as exc:
        print(f"error: the chaos run could not be made: {exc}", file=sys.stderr)
        return 2
    _write("latest", report)  # and its chart, .chaos/latest.png
    print(render(report))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
