"""The invariant of the relay operations (tools/chaos/relay_operations.py): each switch answered
SUCCESS, the outbox ends on the run's relay, each replayed event on the bus again."""

from __future__ import annotations

from tools.chaos.evidence import Check, Evidence, OperationsEvidence
from tools.chaos.poison import POSTGRES_OUTBOX
from tools.chaos.snapshot import PARKED


def relay_operations(evidence: Evidence, operations: OperationsEvidence) -> Check:
    """The relay operations did what they say: each switch answered SUCCESS (a deploy answered FAILED
    before it changed nothing and was rolled back) and the outbox ends with the run's relay; each event
    a replay put out again reached the bus after the replay began (the bus's time of its last arrival in
    the capture queue), a poison row among them was parked; whatever its answer left out is injected
    poison, and each poison row in its window is named."""
    check = Check(
        "relay_operations",
        "each relay switch answered SUCCESS, the outbox ends on the run's relay; every event a replay "
        "selected on the bus again after it began; what it left out is the injected poison, named",
    )
    for switch in operations.switches:
        if switch.status != "SUCCESS":
            check.fail(
                f"relay switch {switch.label}: {switch.status or 'no answer'} at its last deploy "
                f"({len(switch.failed)} failed): {switch.reason[:300]}"
            )
        for failure in switch.failed:
            left, rollback = failure.get("mode_after"), failure.get("rollback")
            if left != switch.relay_from or rollback != "SUCCESS":
                check.fail(
                    f"relay switch {switch.label}: a failed deploy left the relay {left} "
                    f"(rollback {rollback}: {str(failure.get('rollback_reason'))[:200]})"
                )
    if operations.final_mode != operations.expected_mode:
        check.fail(f"the outbox ends on the {operations.final_mode} relay, not {operations.expected_mode}")
    for error in operations.errors:
        check.fail(f"running the operations: {error[:300]}")
    rows = {(r.pk, r.sk): r for r in evidence.snapshot.outbox}
    poison = {
        item.event_id: rows.get((item.pk, item.sk))
        for item in evidence.poison_items
        if item.table == POSTGRES_OUTBOX
    }
    again = 0
    for replay in operations.replays:
        if replay.error:
            check.fail(f"{replay.label}: {replay.error[:300]}")
            continue
        for event_id in replay.replayed:
            if event_id in poison:  # replayed before the relay parked it: parked now, never put
                if (record := poison[event_id]) is None or record.state != PARKED:
                    check.fail(f"{replay.label}: the poison row {event_id} it replayed is not parked")
                continue
            # On the bus after the replay began (once, for a row it named before the relay had put it out).
            captured = evidence.bus.get(event_id)
            if captured is None or captured.last_at < replay.began:
                seen = (
                    f"{captured.deliveries} time(s), last at {captured.last_at:.1f}" if captured else "never"
                )
                check.fail(f"{replay.label}: {event_id} on the bus {seen}")
            else:
                again += 1
        for reason in ("parked", "expired", "missing"):
            for event_id in replay.named.get(reason, []):
                if event_id not in poison:
                    check.fail(f"{replay.label} left out {event_id} ({reason}), which is no poison")
        named = set(replay.replayed).union(*replay.named.values())
        low, high = replay.window
        for event_id, record in sorted(poison.items()):
            created = record.created_at if record is not None else None
            if created is not None and low <= created <= high and event_id not in named:
                check.fail(f"{replay.label} did not name the poison row {event_id} in its window")
    check.figures["switches"] = len(operations.switches)
    check.figures["switches_answered_success"] = sum(1 for s in operations.switches if s.status == "SUCCESS")
    check.figures["deploys_failed_and_rolled_back"] = sum(len(s.failed) for s in operations.switches)
    check.figures["final_mode"] = operations.final_mode
    check.figures["replayed_events"] = sum(len(r.replayed) for r in operations.replays)
    check.figures["replayed_events_on_the_bus_again"] = again
    return check
