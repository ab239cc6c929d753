"""The invariants, checked against the stores, the bus capture, the topic capture and the queues.

evaluate() turns the Evidence a run gathered (tools/chaos/evidence.py: the stores' snapshot, read by
tools/chaos/snapshot.py, with the ledger and what the client saw) into named checks, each with a count
and examples. The checks are grouped by what they hold: the events (check_events.py), what the events
did (check_effects.py), the dead letters (check_dead_letters.py) and the relay operations
(check_operations.py). One set of checks reads both order stores; what only PostgreSQL records (a row
published, parked or still pending; the inbox) is checked where it is there.
"""

from __future__ import annotations

from tools.chaos.check_dead_letters import dead_letters
from tools.chaos.check_effects import (
    api_contract,
    effects_once,
    notifications,
    order_histories,
    orders_created_once,
    states_consistent,
)
from tools.chaos.check_events import lost, phantom, published_in_order
from tools.chaos.check_operations import relay_operations
from tools.chaos.evidence import Check, Evidence


def evaluate(evidence: Evidence) -> list[Check]:
    checks = [
        lost(evidence),
        phantom(evidence),
        published_in_order(evidence),
        orders_created_once(evidence),
        order_histories(evidence),
        effects_once(evidence),
        notifications(evidence),
        states_consistent(evidence),
        dead_letters(evidence),
        api_contract(evidence),
    ]
    if evidence.operations is not None:
        checks.append(relay_operations(evidence, evidence.operations))
    harness = Check("harness", "the harness itself saw no error (capture, duplicates)")
    for error in evidence.harness_errors:
        harness.fail(error)
    checks.append(harness)
    return checks
