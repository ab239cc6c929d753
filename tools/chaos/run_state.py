"""A chaos run's state, shared by its roles (drive.py, drain.py, gathering.py, figures.py; harness.Run is
all of them): the stack with the fault plan preloaded, the ledger, what was injected and when, the
function errors the runtime saw, and the parts that run once the stack is up."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tools.chaos import poison
from tools.chaos.bus import BusCapture, Duplicator, NotificationCapture
from tools.chaos.config import ChaosConfig
from tools.chaos.driver import Driver, stock_for
from tools.chaos.evidence import (
    DEATH_ERRORS,
)
from tools.chaos.fault_plan import fault_plan
from tools.chaos.ledger import Ledger
from tools.chaos.postgres_store import PostgresOrderStore
from tools.chaos.progress import ProgressLine
from tools.chaos.publishers import DatabaseRestart, PublisherPool, RestartGate
from tools.chaos.relay_operations import RelayOperations
from tools.chaos.snapshot import (
    OrderStore,
)
from tools.chaos.topology import chaos_template
from tools.local.console.activity import Invocation
from tools.local.services.emulators import LocalServices
from tools.local.stack import LocalStack, StackOptions

FAULTS_MODULE = Path(__file__).with_name("faults.py")
PROGRESS_SECONDS = 10.0


class RunState:
    """What a run holds from its start to its report: its stack, plan and ledger, what it injected and
    the parts it runs once the stack is up; the roles (drive, drain, gathering, figures) share it."""

    def __init__(
        self,
        config: ChaosConfig,
        services: LocalServices | None = None,
        *,
        with_epilogue: bool = False,
    ) -> None:
        self.config = config
        self.with_epilogue = with_epilogue  # an epilogue runs after the checks (harness.Run)
        self.epilogue_report: dict[str, Any] | None = None
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        self.run_dir = config.out_dir / "runs" / f"{stamp}-seed{config.seed}-n{config.orders}"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.ledger = Ledger(self.run_dir / "ledger.jsonl")
        self.template = chaos_template(config)
        self.plan = fault_plan(config, self.template, self.ledger.path, self.run_dir / "state")
        self.stock = stock_for(config.orders, hot_sku=config.hot_sku)
        seed_file = self.run_dir / "seed.json"
        seed_file.write_text(
            json.dumps({"stock": [{"sku": s, "available": n} for s, n in self.stock.initial.items()]})
        )
        options = StackOptions(
            api_port=0,
            data_dir=self.run_dir / "stack",
            seed_file=seed_file,
            function_environment={
                "LOCAL_WORKER_PRELOAD": str(FAULTS_MODULE),
                "CHAOS_PLAN": self.plan.to_json(),
            },
        )
        self.stack = LocalStack(self.template, options, services=services)
        # Function errors as the runtime saw them (injected or not), for the report and the checks.
        self.function_errors: Counter[tuple[str, str]] = Counter()
        self._errors_lock = threading.Lock()
        self.stack.activity.subscribe(self._on_activity)
        self.poison_items: list[poison.PoisonItem] = []
        self.malformed: list[poison.MalformedMessage] = []
        self.timings: dict[str, float] = {}
        self.client_counters: dict[str, int] = {}
        self.drained = False
        self.stalled = False  # the drain gave up: events missing from the bus, none arriving (STALL_SECONDS)
        # Set once the stack runs: where the orders are, and (postgres) the extra publishers and the restart.
        self.store: OrderStore | None = None
        self.postgres: PostgresOrderStore | None = None
        self.publishers: PublisherPool | None = None
        self.restart: DatabaseRestart | None = None
        self.operations: RelayOperations | None = None
        self._gate = RestartGate()  # the database's restart and the relay operations: never at once
        # The live line (not with `quiet`) and the timeline: when the run's phases began (epoch seconds),
        # when each order was sent, and what the line samples (the parts, once they run).
        self.progress: ProgressLine | None = None
        self.phase = "start"
        self.moments: dict[str, float] = {}
        self.sent_at: list[float] = []
        self.driver: Driver | None = None
        self._parts: tuple[BusCapture, NotificationCapture, Duplicator] | None = None
        self._ledger_lock = threading.Lock()  # the line is drawn from its thread and at phase changes
        self._ledger_offset = 0
        self._ledger_faults = 0
        self._ledger_deaths: Counter[str] = Counter()

    def _on_activity(self, entry: object) -> None:
        if isinstance(entry, Invocation) and entry.result.error is not None:
            with self._errors_lock:
                self.function_errors[(entry.function, entry.result.error.error_type)] += 1

    def say(self, message: str) -> None:
        if self.config.quiet:
            return
        line = f"[chaos {time.strftime('%H:%M:%S')}] {message}"
        if self.progress is not None:
            self.progress.say(line)  # clears the live line first, redraws it after
        else:
            print(line, flush=True)

    def _enter(self, phase: str, moment: str) -> None:
        """A phase begins: its moment on the timeline, and a line at once (a log gets one per phase)."""
        self.phase = phase
        self.moments[moment] = time.time()
        if self.progress is not None:
            self.progress.draw()

    def _deaths(self) -> dict[str, int]:
        with self._errors_lock:
            errors = dict(self.function_errors)
        deaths: Counter[str] = Counter()
        for (function, error_type), count in errors.items():
            if error_type in DEATH_ERRORS:
                deaths[function] += count
        return dict(deaths)
