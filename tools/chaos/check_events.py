"""The invariants of the events: none lost, none made up, each aggregate's first published in order."""

from __future__ import annotations

from collections import defaultdict

from tools.chaos.evidence import Check, Evidence
from tools.chaos.snapshot import PENDING


def _poison_keys(evidence: Evidence) -> set[tuple[str, str]]:
    return {(p.pk, p.sk) for p in evidence.poison_items}


def lost(evidence: Evidence) -> Check:
    check = Check("no_lost_events", "every outbox event of a committed change reached the bus at least once")
    outbox = evidence.snapshot.decodable()
    for event_id, record in outbox.items():
        if event_id not in evidence.bus:
            envelope = record.envelope or {}
            check.fail(f"{envelope.get('type')} {event_id} of {envelope.get('subject')} never on the bus")
    check.figures["lost"] = len(check.violations)
    check.figures["outbox_events"] = len(outbox)
    # Where the store records publishing (PostgreSQL), every event ends marked published or, with the
    # logical relay, behind the replication slot (its bookmark).
    slot = evidence.snapshot.slot_rows is not None
    where = "in the replication slot (never delivered)" if slot else "in the outbox (never marked published)"
    pending = [r for r in outbox.values() if r.state == PENDING]
    for record in pending:
        envelope = record.envelope or {}
        check.fail(
            f"{envelope.get('type')} {envelope.get('id')} of {envelope.get('subject')} "
            f"is still pending {where}"
        )
    check.figures["pending_rows"] = len(pending)
    if slot:
        held = evidence.snapshot.slot_rows or 0
        if held > len(pending):
            check.fail(
                f"the replication slot still holds {held} outbox rows ({len(pending)} of them pending)"
            )
        check.figures["slot_rows"] = held
    return check


def published_in_order(evidence: Evidence) -> Check:
    check = Check(
        "published_in_order",
        "each aggregate's events first reached the bus in sequence order "
        f"({', '.join(sorted(evidence.in_order_sources)) or 'no source promises it in this run'})",
    )
    arrivals: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    for captured in evidence.bus.values():
        detail = captured.detail
        source, sequence = detail.get("source"), detail.get("sequence")
        if source in evidence.in_order_sources and isinstance(sequence, int):
            arrivals[(str(source), str(detail.get("subject")))].append((captured.first_arrival, sequence))
    for (source, subject), seen in sorted(arrivals.items()):
        sequences = [sequence for _, sequence in sorted(seen)]
        if sequences != sorted(sequences):
            check.fail(f"{source} {subject}: events first on the bus in the order {sequences}")
    check.figures["aggregates"] = len(arrivals)
    check.figures["events"] = sum(len(seen) for seen in arrivals.values())
    check.figures["out_of_order"] = len(check.violations)
    return check


def phantom(evidence: Evidence) -> Check:
    check = Check(
        "no_phantom_events", "every event on the bus is an outbox item of a committed change, as written"
    )
    outbox = evidence.snapshot.decodable()
    for event_id, captured in evidence.bus.items():
        record = outbox.get(event_id)
        if record is None:
            check.fail(f"{captured.detail.get('type')} {event_id} on the bus has no outbox item")
        elif captured.detail != record.envelope:
            check.fail(f"{event_id} on the bus differs from its outbox item")
    for body in evidence.foreign_bus_messages:
        check.fail(f"not a CloudEvent of this system on the bus: {body[:120]}")
    undecodable = {(r.pk, r.sk) for r in evidence.snapshot.outbox if r.envelope is None}
    for pk, sk in sorted(undecodable - _poison_keys(evidence)):
        check.fail(f"undecodable outbox item that was not injected: {pk} {sk}")
    check.figures["phantom"] = len(check.violations)
    check.figures["bus_deliveries"] = sum(c.deliveries for c in evidence.bus.values())
    check.figures["bus_distinct_events"] = len(evidence.bus)
    return check
