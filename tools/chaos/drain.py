"""Draining a chaos run: waiting (bounded) until nothing is in flight and everything that must happen has
happened, or until the pipeline is seen stuck (STALL_SECONDS)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from botocore.exceptions import BotoCoreError

from shop.domain.notifications import NOTIFIABLE
from tools.chaos.bus import BusCapture, Duplicator, NotificationCapture, queue_depth
from tools.chaos.run_state import PROGRESS_SECONDS, RunState
from tools.chaos.snapshot import (
    ORDERS_SIDE,
    PENDING,
    collect,
)
from tools.chaos.topology import Topology

_STABLE_POLLS = 2
# The drain gives up once outbox events are missing from the bus and none reached it for this long.
STALL_SECONDS = 300.0
_MISSING = "outbox events not on the bus yet"


class Drain(RunState):
    def _drain(
        self,
        topology: Topology,
        capture: BusCapture,
        notifications: NotificationCapture,
        duplicator: Duplicator,
    ) -> bool:
        """Wait (bounded) until nothing is in flight and everything that must happen has happened."""
        sqs = self.stack.clients.sqs()
        deadline = time.monotonic() + self.config.drain_timeout
        stable = 0
        last_report = 0.0
        # Events of the outbox missing from the bus while no new event reached it for STALL_SECONDS: the
        # pipeline is stuck (a relay failing every round), not slow; waiting the bound out shows nothing more.
        progress: tuple[int, float] = (len(capture.seen()), time.monotonic())
        while time.monotonic() < deadline:
            began = time.monotonic()
            try:
                reasons = self._not_drained(sqs, topology, capture, notifications, duplicator)
            except BotoCoreError as exc:  # moto answering too slowly for once: look again
                reasons = [f"the local services did not answer: {exc}"]
            stable = stable + 1 if not reasons else 0
            if stable >= _STABLE_POLLS:
                self.say("drained")
                return True
            if reasons and time.monotonic() - last_report >= PROGRESS_SECONDS:
                last_report = time.monotonic()
                self.say("draining: " + "; ".join(reasons))
            seen = len(capture.seen())
            if seen != progress[0] or not any(_MISSING in reason for reason in reasons):
                progress = (seen, time.monotonic())
            elif time.monotonic() - progress[1] >= STALL_SECONDS:
                self.stalled = True
                self.say(f"not drained: no new event on the bus for {STALL_SECONDS:.0f} s while {_MISSING}")
                return False
            time.sleep(max(1.0, 2 * (time.monotonic() - began)))
        self.say(f"not drained within {self.config.drain_timeout:.0f} s: checking what is there")
        return False

    def _not_drained(
        self,
        sqs: Any,
        topology: Topology,
        capture: BusCapture,
        notifications: NotificationCapture,
        duplicator: Duplicator,
    ) -> list[str]:
        reasons = []
        in_queues = {q: queue_depth(sqs, self.stack.queue_url(q)) for q in topology.consumer_queues}
        in_queues.update(
            {url.rsplit("/", 1)[-1]: queue_depth(sqs, url) for url in duplicator.delay_queue_urls}
        )
        busy = {q: n for q, n in in_queues.items() if n}
        if busy or duplicator.held():
            reasons.append(f"in queues {busy}, held duplicates {duplicator.held()}")
        backlog = capture.backlog(sqs) + notifications.backlog(sqs)
        if backlog:
            reasons.append(f"{backlog} captured messages not read yet")
        # Poison is parked by the relay in its poison queue; the relay DLQ is not waited for (it must
        # stay empty: nothing in a run is older than RelayMaximumRecordAgeSeconds).
        parked = queue_depth(sqs, self.stack.queue_url(topology.relay_poison_queue))
        if parked < len(self.poison_items):
            reasons.append(f"poison queue {parked}/{len(self.poison_items)}")
        expected = Counter(m.queue for m in self.malformed)
        for queue, count in expected.items():
            found = queue_depth(sqs, self.stack.queue_url(topology.consumer_dlqs[queue]))
            if found < count:
                reasons.append(f"{topology.consumer_dlqs[queue]} {found}/{count}")
        if self.restart is not None and not self.restart.done:
            reasons.append("the order database is restarting")
        if self.operations is not None and self.operations.busy():
            reasons.append("relay operations under way")
        if reasons:
            return reasons  # the table scan below is the expensive part
        snapshot = collect(self.stack, self.store)
        pending = sum(1 for o in snapshot.orders.values() if o["status"] == "PENDING")
        if pending:
            reasons.append(f"{pending} orders PENDING")
        rows = sum(1 for r in snapshot.outbox if r.state == PENDING)
        if snapshot.slot_rows:  # logical: the slot is the bookmark (a parked row in it counts too)
            reasons.append(f"{snapshot.slot_rows} outbox rows in the replication slot")
        elif rows:
            reasons.append(f"{rows} outbox rows pending")
        seen = capture.seen()
        outbox = snapshot.decodable()
        unseen = [i for i in outbox if i not in seen]
        if unseen:
            reasons.append(f"{len(unseen)} {_MISSING}")
        published = notifications.by_event_id()
        silent = [
            i
            for i, r in outbox.items()
            if r.table == ORDERS_SIDE and (r.envelope or {}).get("type") in NOTIFIABLE and i not in published
        ]
        if silent:
            reasons.append(f"{len(silent)} notifications not published yet")
        return reasons
