"""The invariants of what the events did: one order per request key, one transition per event, each
effect once (stock, inbox), one notification per notifiable event, the stores agreeing with each other
and with what the client was told, and the API's contract as the client saw it."""

from __future__ import annotations

from collections import Counter
from typing import Any

from shop.adapters.dynamodb import keys
from shop.domain.inventory import INVENTORY_REJECTED, INVENTORY_RELEASED, INVENTORY_RESERVED
from shop.domain.notifications import NOTIFIABLE
from shop.domain.orders import ORDER_CANCELLED, ORDER_CONFIRMED, ORDER_CREATED, ORDER_REJECTED
from tools.chaos.evidence import Check, Evidence
from tools.chaos.plan import CRASH_AFTER_PUBLISH
from tools.chaos.snapshot import INVENTORY_SIDE, ORDERS_SIDE
from tools.local.gateway.server import local_caller_arn

NOTIFIER = "NotificationFunction"

# Every legal history of an order (outbox event types in sequence order) and the status it ends in.
ORDER_HISTORIES: dict[tuple[str, ...], str] = {
    (ORDER_CREATED,): "PENDING",
    (ORDER_CREATED, ORDER_CONFIRMED): "CONFIRMED",
    (ORDER_CREATED, ORDER_REJECTED): "REJECTED",
    (ORDER_CREATED, ORDER_CANCELLED): "CANCELLED",
    (ORDER_CREATED, ORDER_CONFIRMED, ORDER_CANCELLED): "CANCELLED",
}
# Every legal history of a reservation, by its final status.
RESERVATION_HISTORIES: dict[str, set[tuple[str, ...]]] = {
    "RESERVED": {(INVENTORY_RESERVED,)},
    "REJECTED": {(INVENTORY_REJECTED,)},
    "RELEASED": {(INVENTORY_RESERVED, INVENTORY_RELEASED)},
    "CANCELLED": {(), (INVENTORY_REJECTED,)},  # cancelled before anything was reserved
}
# Which reservation statuses each final order status is consistent with.
CONSISTENT: dict[str, set[str]] = {
    "CONFIRMED": {"RESERVED"},
    "REJECTED": {"REJECTED"},
    "CANCELLED": {"RELEASED", "CANCELLED"},
}


def orders_created_once(evidence: Evidence) -> Check:
    check = Check(
        "orders_created_once",
        "one order per Idempotency-Key, whatever the retries; every 201 for a key names that order",
    )
    snapshot = evidence.snapshot
    keyed: dict[str, str] = {}
    for request_pk, order_ids in snapshot.request_orders.items():
        if len(order_ids) != 1:
            check.fail(f"request key {request_pk} has {len(order_ids)} records")
        keyed[request_pk] = order_ids[0]
    referenced = Counter(keyed.values())
    for order_id in snapshot.orders:
        if referenced[order_id] != 1:
            check.fail(f"order {order_id} is named by {referenced[order_id]} Idempotency-Key records")
    replays = 0
    for outcome in evidence.outcomes:
        # The driver sends no X-Local-Caller: every request is the local API's default caller.
        request_pk = keys.request_key(local_caller_arn(), outcome.script.key)[keys.PK]["S"]
        committed = keyed.get(request_pk)
        if outcome.order_ids and {committed} != outcome.order_ids:
            check.fail(
                f"key {outcome.script.key}: answers name {sorted(outcome.order_ids)}, table has {committed}"
            )
        if committed is not None and committed not in snapshot.orders:
            check.fail(f"key {outcome.script.key}: its order {committed} does not exist")
        replays += sum(1 for a in outcome.create_answers if a.status == 201 and a.replayed)
    check.figures["orders"] = len(snapshot.orders)
    check.figures["idempotent_replays"] = replays
    return check


def order_histories(evidence: Evidence) -> Check:
    check = Check(
        "one_transition_per_event",
        "order version = number of its outbox items (sequences 1..version), a legal history, its status",
    )
    histories = evidence.snapshot.history("OrdersTable")
    for order_id, order in evidence.snapshot.orders.items():
        envelopes = histories.get(order_id, [])
        sequences = [int(e["sequence"]) for e in envelopes]
        types = tuple(str(e["type"]) for e in envelopes)
        if sequences != list(range(1, int(order["version"]) + 1)):
            check.fail(
                f"order {order_id} version {order['version']} has outbox sequences {sequences} {types}"
            )
        elif ORDER_HISTORIES.get(types) != order["status"]:
            check.fail(f"order {order_id} is {order['status']} with history {types}")
    orphans = set(histories) - set(evidence.snapshot.orders)
    for order_id in sorted(orphans):
        check.fail(f"outbox items of order {order_id}, which does not exist")
    return check


def effects_once(evidence: Evidence) -> Check:
    check = Check(
        "effects_once",
        "each event caused at most one change; stock taken = sum of RESERVED reservations, never below 0",
    )
    snapshot = evidence.snapshot
    causes = Counter(
        str(r.envelope["causationid"])
        for r in snapshot.outbox
        if r.envelope is not None and r.envelope.get("causationid")
    )
    for cause, count in causes.items():
        if count > 1:
            check.fail(f"event {cause} caused {count} changes")
    histories = snapshot.history("InventoryTable")
    for order_id, reservation in snapshot.reservations.items():
        envelopes = histories.get(order_id, [])
        types = tuple(str(e["type"]) for e in envelopes)
        sequences = [int(e["sequence"]) for e in envelopes]
        if types not in RESERVATION_HISTORIES.get(str(reservation["status"]), set()):
            check.fail(f"reservation {order_id} is {reservation['status']} with history {types}")
        elif sequences != list(range(1, len(envelopes) + 1)):
            check.fail(f"reservation {order_id} has outbox sequences {sequences}")
    reserved: Counter[str] = Counter()
    for reservation in snapshot.reservations.values():
        if reservation["status"] == "RESERVED":
            for line in reservation["lines"]:
                reserved[str(line["sku"])] += int(line["quantity"])
    duplicates = len(check.violations)
    for sku, initial in sorted(evidence.initial_stock.items()):
        remaining = snapshot.stock.get(sku)
        if remaining is None or initial - remaining != reserved[sku]:
            check.fail(f"{sku}: initial {initial} - remaining {remaining} != reserved {reserved[sku]}")
        elif remaining < 0:
            check.fail(f"{sku}: stock below zero ({remaining})")
    duplicates += _inbox(evidence, check)
    check.figures["duplicate_effects"] = duplicates
    check.figures["stock_mismatches"] = len(check.violations) - duplicates
    check.figures["reserved_units"] = sum(reserved.values())
    return check


def _inbox(evidence: Evidence, check: Check) -> int:
    """PostgreSQL: the inbox holds exactly the causes of the order changes it recorded, each once (its
    row is written in the transaction of the change). Returns the violations found."""
    snapshot = evidence.snapshot
    if snapshot.order_store != "postgres":
        return 0
    before = len(check.violations)
    inventory_events = {i for i, r in snapshot.decodable().items() if r.table == INVENTORY_SIDE}
    caused = Counter(
        str(r.envelope["causationid"])
        for r in snapshot.decodable().values()
        if r.table == ORDERS_SIDE
        and r.envelope is not None
        and r.envelope.get("causationid") in inventory_events
    )
    recorded = Counter(event_id for _, event_id in snapshot.inbox)
    for event_id in sorted(set(recorded) - set(caused)):
        check.fail(f"the inbox records event {event_id}, which changed no order")
    for event_id in sorted(set(caused) - set(recorded)):
        check.fail(f"event {event_id} changed an order without its inbox row")
    for event_id, count in sorted(recorded.items()):
        if count > 1:
            check.fail(f"the inbox records event {event_id} {count} times")
    check.figures["inbox_rows"] = sum(recorded.values())
    return len(check.violations) - before


def notifications(evidence: Evidence) -> Check:
    check = Check(
        "one_notification_per_event",
        "one notification per notifiable event, plus exactly one per crash injected in the publish window",
    )
    window = Counter(
        event_id
        for entry in evidence.ledger
        if entry["kind"] == CRASH_AFTER_PUBLISH
        for event_id in entry.get("event_ids", [])
    )
    notifiable = {
        event_id
        for event_id, record in evidence.snapshot.decodable().items()
        if record.table == "OrdersTable" and (record.envelope or {}).get("type") in NOTIFIABLE
    }
    window_duplicates = excess = missing = 0
    excess_events: list[str] = []
    for event_id in notifiable:
        count = evidence.notifications.get(event_id, 0)
        expected = 1 + window[event_id]
        if count == 0:
            missing += 1
            check.fail(f"event {event_id}: no notification")
        elif count > expected:
            excess += count - expected
            excess_events.append(
                f"event {event_id}: {count} notifications, {expected} explained by injection"
            )
        elif count < expected:
            check.fail(f"event {event_id}: {count} notifications after {window[event_id]} window crash(es)")
        window_duplicates += min(count, expected) - 1 if count else 0
    # An environment that died on its own (a timeout under load) in the same window, or a Publish whose
    # answer was lost (the SDK retries it), repeats at most one notification: such repeats are explained
    # by what was observed, and reported; any more fail.
    deaths = evidence.uninjected_deaths(NOTIFIER)
    lost_answers = evidence.lost_publish_responses()
    natural = deaths + lost_answers
    unexplained = max(0, excess - natural)
    if unexplained:
        for line in excess_events:
            check.fail(
                f"{line} ({deaths} uninjected death(s) of {NOTIFIER}, "
                f"{lost_answers} lost Publish answer(s) observed)"
            )
    for event_id, count in evidence.notifications.items():
        if event_id not in notifiable:
            check.fail(
                f"{count} notification(s) for {event_id}, not a notifiable event of a committed change"
            )
    for body in evidence.unreadable_notifications:
        check.fail(f"unreadable notification: {body[:120]}")
    check.figures.update(
        notifiable_events=len(notifiable),
        notifications=sum(evidence.notifications.values()),
        window_duplicates=window_duplicates,
        window_crashes_injected=sum(window.values()),
        repeats_after_uninjected_deaths=excess - unexplained,
        uninjected_notifier_deaths=deaths,
        lost_publish_responses=lost_answers,
        unexplained_duplicates=unexplained,
        missing=missing,
    )
    return check


def _lines(items: list[dict[str, Any]]) -> dict[str, int]:
    totals: Counter[str] = Counter()
    for line in items:
        totals[str(line["sku"])] += int(line["quantity"])
    return dict(totals)


def states_consistent(evidence: Evidence) -> Check:
    check = Check(
        "states_consistent",
        "no order PENDING; every order's reservation agrees with its status; clients saw what happened",
    )
    snapshot = evidence.snapshot
    statuses: Counter[str] = Counter()
    for order_id, order in snapshot.orders.items():
        status = str(order["status"])
        statuses[status] += 1
        reservation = snapshot.reservations.get(order_id)
        if status == "PENDING":
            check.fail(f"order {order_id} still PENDING")
            continue
        if reservation is None:
            check.fail(f"order {order_id} ({status}) has no reservation")
            continue
        if reservation["status"] not in CONSISTENT[status]:
            check.fail(f"order {order_id} is {status}, its reservation {reservation['status']}")
        if status == "CONFIRMED" and _lines(order["lines"]) != _lines(reservation["lines"]):
            check.fail(f"order {order_id}: reserved lines differ from ordered lines")
        if status == "CANCELLED" and int(reservation["orderSequence"]) != int(order["version"]):
            check.fail(f"order {order_id}: reservation saw order event {reservation['orderSequence']}")
    for order_id in sorted(set(snapshot.reservations) - set(snapshot.orders)):
        check.fail(f"reservation {order_id} without an order")
    for outcome in evidence.outcomes:
        final = outcome.cancel_final
        if final is None or not outcome.order_ids:
            continue
        order = snapshot.orders.get(sorted(outcome.order_ids)[0], {})
        if final.status == 200 and order.get("status") != "CANCELLED":
            check.fail(f"cancel of {order.get('orderId')} answered 200, order is {order.get('status')}")
        if final.error_code == "ILLEGAL_TRANSITION" and order.get("status") != "REJECTED":
            check.fail(f"cancel of {order.get('orderId')} refused, order is {order.get('status')}")
    check.figures["statuses"] = dict(sorted(statuses.items()))
    return check


def api_contract(evidence: Evidence) -> Check:
    check = Check(
        "api_contract",
        "every request answered within the retry budget; no 5xx but 503; every 4xx with the error body",
    )
    for outcome in evidence.outcomes:
        for answer in outcome.create_answers + outcome.cancel_answers:
            if answer.problem:
                check.fail(f"order #{outcome.script.index}: {answer.problem}")
        if not outcome.created:
            check.fail(f"order #{outcome.script.index} never got a 201 within the retry budget")
        final = outcome.cancel_final
        if outcome.script.cancel and outcome.created and (final is None or final.status not in {200, 409}):
            check.fail(f"cancel of order #{outcome.script.index} never got a final answer")
        if final is not None and final.status == 409 and final.error_code != "ILLEGAL_TRANSITION":
            check.fail(f"cancel of order #{outcome.script.index} ended with {final.error_code}")
    return check
