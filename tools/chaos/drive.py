"""Driving a chaos run: the orders, cancels and client retries over HTTP (driver.py), with at their
points the poison (poison.py), the publishers' second half, the relay operations and the database's
restart."""

from __future__ import annotations

import time
from collections.abc import Callable

from tools.chaos import poison
from tools.chaos.driver import Driver, OrderOutcome, OrderScript, scripts
from tools.chaos.publishers import DatabaseRestart
from tools.chaos.run_state import PROGRESS_SECONDS, RunState
from tools.chaos.topology import Topology


class Drive(RunState):
    def _poison_queues(self, topology: Topology) -> None:
        for queue, function in sorted(topology.consumer_queues.items()):
            for variant in (poison.NOT_JSON, poison.NOT_A_CLOUDEVENT):
                self.malformed.append(
                    poison.send_malformed_message(self.stack, self.ledger, queue, function, variant)
                )

    def _poison_table(self, table: str, variant: str) -> None:
        item = poison.write_poison_item(
            self.stack.clients.dynamodb(), self.stack, self.ledger, table, variant
        )
        self.poison_items.append(item)

    def _poison_row(self, variant: str, real_order: bool = False) -> None:
        """postgres: a poison row in the outbox, of a made-up aggregate or of the latest real order."""
        assert self.postgres is not None
        order_id = self.postgres.latest_order() if real_order else None
        if real_order and order_id is None:
            return
        self.poison_items.append(
            self.postgres.write_poison_row(self.ledger, variant, self.config.max_event_bytes, order_id)
        )

    def _drive(self) -> list[OrderOutcome]:
        plan = scripts(self.config.orders, self.config.seed, self.stock)
        driver = self.driver = Driver(
            self.stack.api_url, self.config.client_timeout_seconds, self.config.workers
        )
        at: dict[int, list[Callable[[], None]]] = {}
        if self.config.inject_poison:
            at.setdefault(len(plan) // 3, []).append(
                lambda: self._poison_table("InventoryTable", poison.NO_ENVELOPE)
            )
            if self.config.postgres:
                at[len(plan) // 3].append(lambda: self._poison_row(poison.OVERSIZE))
                at.setdefault(2 * len(plan) // 3, []).append(
                    lambda: self._poison_row(poison.INVALID_ENVELOPE, real_order=True)
                )
            else:
                at.setdefault(2 * len(plan) // 3, []).append(
                    lambda: self._poison_table("OrdersTable", poison.INVALID_ENVELOPE)
                )
        publishers = self.publishers
        if publishers is not None:
            second = self.config.publishers_at_once[1]
            at.setdefault(len(plan) // 2, []).append(
                lambda: publishers.set_target("drive, second half", second)
            )
        if self.operations is not None:
            self.operations.schedule(len(plan), at, self.config.switches_at, self.config.replays_at)
        restart = self.restart
        if restart is not None and self.config.restart_at is not None:
            index = min(len(plan) - 1, int(self.config.restart_at * len(plan)))
            at.setdefault(index, []).insert(0, lambda: self._restart_database(restart, index))
        started = time.monotonic()
        last = [started]
        self._enter("drive", "drive_began")
        if publishers is not None:
            publishers.start("drive, first half", self.config.publishers_at_once[0])

        def progress(index: int, _: OrderScript) -> None:
            self.sent_at.append(time.time())
            for action in at.get(index, []):
                action()
            if time.monotonic() - last[0] >= PROGRESS_SECONDS:
                last[0] = time.monotonic()  # the live line counts the orders; this, the client's answers
                self.say(f"driving: client so far {dict(driver.counts())}")

        outcomes = driver.run(plan, progress, rate=self.config.rate)
        if restart is not None:
            restart.join()  # the drive may end during the outage: the restart is part of it
        self.timings["drive_seconds"] = time.monotonic() - started
        self.client_counters = dict(driver.counters)
        self.say(f"driven in {self.timings['drive_seconds']:.1f} s: {self.client_counters}")
        return outcomes

    def _restart_database(self, restart: DatabaseRestart, index: int) -> None:
        self.say(f"restarting the order database (down {restart.down_seconds:g} s) at order {index + 1}")
        restart.start(index)
