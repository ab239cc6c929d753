"""The invariant of the dead letters: each injected poison parked once and whole (again only after a
rolled-back round), the relay DLQ empty, each consumer DLQ exactly its malformed messages; and how a
parked poison message is read (parked_poison, parked_key, canonical_item)."""

from __future__ import annotations

import contextlib
import itertools
import json
from collections import Counter, defaultdict
from datetime import datetime
from typing import Any

from shop.adapters.dynamodb import keys
from shop.adapters.poison_queue import POISON_KIND
from tools.chaos.evidence import ROLLBACK_KINDS, Check, Evidence
from tools.chaos.poison import POSTGRES_OUTBOX, PoisonItem
from tools.chaos.snapshot import PARKED, postgres_row_key

_CLOCK_SLACK_SECONDS = 0.5  # between the ledger's clock and the poison message's parkedAt


def canonical_item(item: dict[str, Any] | None) -> str:
    """An item in attribute-value form as canonical JSON: equal text, equal bytes attribute for attribute."""
    return json.dumps(item, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def parked_poison(body: str) -> dict[str, Any] | None:
    """A relay poison queue message, decoded; None when it is not one."""
    try:
        message = json.loads(body)
    except ValueError:
        return None
    if not isinstance(message, dict) or message.get("kind") != POISON_KIND:
        return None
    return message


def parked_key(message: dict[str, Any]) -> tuple[str, str] | None:
    """The outbox item key a parked poison message names (from its item, or its key when omitted); a
    PostgreSQL row (item["store"] == "postgres") by postgres_row_key."""
    item = message.get("item") or message.get("key")
    if not isinstance(item, dict):
        return None
    if item.get("store") == "postgres":
        aggregate, sequence, event_id = item.get("aggregateId"), item.get("sequence"), item.get("eventId")
        if isinstance(aggregate, str) and isinstance(sequence, int) and isinstance(event_id, str):
            return postgres_row_key(aggregate, sequence, event_id)
        return None
    pk, sk = (item.get(keys.PK) or {}).get("S"), (item.get(keys.SK) or {}).get("S")
    return (pk, sk) if isinstance(pk, str) and isinstance(sk, str) else None


def comparable_item(item: dict[str, Any]) -> dict[str, Any]:
    """A parked item as the table holds it: a PostgreSQL row without `attempts` (parking counts one
    more in the row) and its `createdAt` as epoch seconds (the sessions' time zones aside)."""
    if item.get("store") != "postgres":
        return item
    out = {name: value for name, value in item.items() if name != "attempts"}
    created = out.get("createdAt")
    if isinstance(created, str):
        with contextlib.suppress(ValueError):
            out["createdAt"] = datetime.fromisoformat(created).timestamp()
    return out


def _epoch_of(text: object) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def _rollbacks(evidence: Evidence) -> list[tuple[float, float]]:
    """When work that had parked poison was undone on purpose: a publisher's or the stream relay's
    process killed after a PutEvents call (injected: the round rolls back, the stream batch is
    delivered again), the logical relay's killed after a slot advance (its round rolls back, and the
    slot stops before a row parked in it), or the database down."""
    crashes = [  # an armed crash holds its round's locks `hold_seconds` first
        (float(entry["at"]), float(entry["at"]) + float(entry.get("hold_seconds") or 0.0))
        for entry in evidence.ledger
        if entry["kind"] in ROLLBACK_KINDS
    ]
    return crashes + list(evidence.database_outages)


def dead_letters(evidence: Evidence) -> Check:
    check = Check(
        "dead_letters_exact",
        "the poison queue holds each injected poison item once, whole (once more per rolled-back round "
        "or crashed relay invocation that had parked it), a row marked parked; the relay DLQ nothing; "
        "each consumer DLQ exactly its malformed messages",
    )
    poison = {(p.pk, p.sk): p for p in evidence.poison_items}
    parked: Counter[tuple[str, str]] = Counter()
    parked_times: dict[tuple[str, str], list[float]] = defaultdict(list)
    whole: set[tuple[str, str]] = set()  # parked with its item, equal to the table's, byte for byte
    for body in evidence.relay_poison_queue:
        message = parked_poison(body)
        key = parked_key(message) if message is not None else None
        if message is None or key is None:
            check.fail(f"poison queue message that is not a parked outbox record: {body[:200]}")
            continue
        parked[key] += 1
        when = _epoch_of(message.get("parkedAt"))
        if when is not None:
            parked_times[key].append(when)
        injected = poison.get(key)
        if injected is None:
            check.fail(f"poison queue holds a record that was not injected: {key[0]} {key[1]}")
            continue
        if message.get("eventId") != injected.event_id:
            check.fail(
                f"poison {key[0]} {key[1]} parked as event {message.get('eventId')}, not {injected.event_id}"
            )
            continue
        if "item" not in message:
            check.fail(f"poison {key[0]} {key[1]} parked without its item: {message.get('itemOmitted')}")
            continue
        in_table = evidence.poison_table_items.get(key)
        if in_table is None:
            check.fail(f"poison {key[0]} {key[1]} is no longer in {injected.table}")
        elif canonical_item(comparable_item(message["item"])) != canonical_item(in_table):
            check.fail(f"poison {key[0]} {key[1]}: the parked item differs from the item in {injected.table}")
        else:
            whole.add(key)
    again = _parked_again(evidence, poison, parked, parked_times, check)
    for pk, sk in sorted(set(poison) - set(parked)):
        check.fail(f"poison outbox item {pk} {sk} is not in the poison queue")
    _rows_parked(evidence, poison, check)
    for body, batch_keys in zip(evidence.relay_dlq, evidence.relay_dlq_keys, strict=True):
        covers = f"covering {len(batch_keys)} outbox record(s), e.g. {sorted(batch_keys)[:3]}"
        check.fail(f"the relay DLQ must stay empty; it holds a batch {covers}: {body[:160]}")
    expected: dict[str, set[str]] = defaultdict(set)
    for malformed in evidence.malformed:
        expected[malformed.queue].add(malformed.body)
    for queue in sorted(set(expected) | set(evidence.consumer_dlqs)):
        found = Counter(evidence.consumer_dlqs.get(queue, []))
        for body, count in found.items():
            if body not in expected[queue]:
                check.fail(f"{queue} DLQ holds a message that was not injected: {body[:160]}")
            elif count > 1:
                check.fail(f"{queue} DLQ holds a malformed message {count} times")
        for body in expected[queue] - set(found):
            check.fail(f"{queue} DLQ lacks the malformed message {body[:80]}")
    check.figures["poison_queue_messages"] = len(evidence.relay_poison_queue)
    # Injected poison items parked exactly once (or again after a rolled-back round), whole and equal
    # to the table's item.
    check.figures["poison_parked_whole"] = sum(1 for k in whole if parked[k] == 1 or k in again)
    check.figures["poison_parked_again_after_rollback"] = sum(parked[k] - 1 for k in again)
    check.figures["poison_outbox_items"] = len(poison)
    check.figures["relay_dlq_messages"] = len(evidence.relay_dlq)
    check.figures["consumer_dlq_messages"] = {q: len(b) for q, b in sorted(evidence.consumer_dlqs.items())}
    check.figures["malformed_messages"] = len(evidence.malformed)
    return check


def _parked_again(
    evidence: Evidence,
    poison: dict[tuple[str, str], PoisonItem],
    parked: Counter[tuple[str, str]],
    parked_times: dict[tuple[str, str], list[float]],
    check: Check,
) -> set[tuple[str, str]]:
    """Poison parked more than once: a PostgreSQL row is parked inside the publisher's round, so a round
    rolled back after parking it (its process killed between PutEvents and COMMIT, the database down)
    leaves it pending and the next round parks it again; a stream record parked by a relay invocation
    that then dies is delivered again with its batch and parked again. Each repeat must follow such a
    rollback; returns the records whose repeats all do, and fails the others."""
    rollbacks = _rollbacks(evidence)
    explained: set[tuple[str, str]] = set()
    for key, count in sorted(parked.items()):
        if count <= 1 or key not in poison:
            continue
        times = sorted(parked_times.get(key, []))
        rolled_back = len(times) == count and all(
            any(
                start - _CLOCK_SLACK_SECONDS <= later and earlier <= end + _CLOCK_SLACK_SECONDS
                for start, end in rollbacks
            )
            for earlier, later in itertools.pairwise(times)
        )
        if rolled_back:
            explained.add(key)
        else:
            check.fail(f"poison {key[0]} {key[1]} parked {count} times")
    return explained


def _rows_parked(evidence: Evidence, poison: dict[tuple[str, str], PoisonItem], check: Check) -> None:
    """PostgreSQL: each poison row ends marked parked (never published), and no other row is parked."""
    records = {(r.pk, r.sk): r for r in evidence.snapshot.outbox}
    for key, injected in sorted(poison.items()):
        if injected.table != POSTGRES_OUTBOX:
            continue
        record = records.get(key)
        if record is None:
            check.fail(f"poison row {key[0]} {key[1]} is no longer in the outbox")
        elif record.state != PARKED:
            check.fail(f"poison row {key[0]} {key[1]} is {record.state}, not parked")
    for key, record in sorted(records.items()):
        if record.state == PARKED and key not in poison:
            check.fail(f"row {key[0]} {key[1]} was parked, and it is no injected poison")
