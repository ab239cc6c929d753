"""Operator commands for the outbox: redrive the relay dead-letter queue, replay events from the outbox
tables, move a consumer dead-letter queue's messages back to its queue, and (OrderStore=postgres) decide
on parked rows and recover a lost replication slot.

    python -m operations redrive --stack-name NAME            # or --queue-url/--bus
    python -m operations redrive-poison --stack-name NAME     # records the relay parked
    python -m operations redrive-dlq --queue-url DLQ_URL      # a consumer's dead-letter queue, back to its
        queue (or --stack-name NAME --consumer Inventory|OrderStatus|Notification; --to-queue-url URL;
        --include-expired: also messages older than the consumers would still remember once delivered)
    python -m operations replay --stack-name NAME --from 2026-11-21T10:00:00Z --to ...
    python -m operations replay --stack-name NAME --event-id ID [--event-id ID ...] [--include-expired]
        [--from T] [--to T]   (DynamoDB: the hours to look for the events in; default the republish window)
        (every outbox table of the stack: the orders' and the inventory's; --table TABLE: that one alone.
        OrderStore=postgres: the order database too, whose maintenance function makes the rows pending
        again and waits for the relay to republish them; the report says what is back on the bus)
    python -m operations seed --stack-name NAME --file tools/local/seed.json
  OrderStore=postgres only (the database is in a private VPC: these invoke the stack's maintenance
  function, output OrderStoreMaintenanceFunctionName, or --order-store-function):
    python -m operations --stack-name NAME redrive-poison --event-id ID   # a parked row, by event id
    python -m operations --stack-name NAME discard-poison ID [ID ...] --reason WHY [--execute]
    python -m operations --stack-name NAME recover-slot [--since T] [--include-expired] [--execute]
        (discard-poison and recover-slot are dry runs unless --execute; redrive-poison with the stack's
        name redrives each parked row of the order database from the database, whatever its message holds)

Names come from the stack's outputs (--stack-name), from a running local stack's (--local, on port PORT:
operations/local_stack.py), or are given explicitly. Republishing is safe:
every consumer deduplicates on the CloudEvent id for the whole republish window (OutboxTtlDays).
A queue message is deleted only when its report is complete; otherwise it stays, the report names
what is missing, and the command exits 1. A record parked in the poison queue on the way counts as
complete (the poison queue holds it whole) but not as done: the command exits 1 and names it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError, NoRegionError

from operations import local_stack
from operations.dead_letters import NoDestination, move_messages, source_queue
from operations.queue_run import QueueRun
from operations.recovery import FailedStreamBatch, OutboxRecovery, RecoveryReport
from operations.stack import OUTBOX_TABLE_OUTPUTS, forget_stacks, settings_of, stack_output, stack_outputs
from shop.adapters import aws
from shop.adapters.dynamodb.inventory_repository import DynamoInventoryRepository
from shop.adapters.eventbridge import EventPublisher
from shop.adapters.poison_queue import PoisonQueue, checked_poison_message
from shop.domain.envelope import parse_time
from shop.domain.errors import InvalidEnvelope
from shop.runtime.config import Settings

CONSUMERS = ("Inventory", "OrderStatus", "Notification")  # their stack outputs' prefixes


def _resolve(args: argparse.Namespace, attribute: str, output: str) -> str:
    value = getattr(args, attribute)
    if value:
        return str(value)
    if args.stack_name:
        return stack_output(args.stack_name, output)
    raise SystemExit(f"error: give --{attribute.replace('_', '-')}, --stack-name or --local")


def _recovery(
    args: argparse.Namespace, order_store: Callable[[dict[str, Any]], dict[str, Any]] | None = None
) -> OutboxRecovery:
    settings = settings_of(args)
    bus = _resolve(args, "bus", "EventBusName")
    return OutboxRecovery(
        EventPublisher(bus, settings.max_event_bytes),
        PoisonQueue(_resolve(args, "poison_queue_url", "RelayPoisonQueueUrl")),
        max_event_bytes=settings.max_event_bytes,
        time_shards=settings.outbox_time_shards,
        ttl_days=settings.outbox_ttl_days,
        order_store=order_store,
    )


class OrderStoreFunctionError(RuntimeError):
    """The maintenance function failed, or refused the request: nothing is known to be done."""


def invoke_order_store(function_name: str, request: dict[str, Any]) -> dict[str, Any]:
    """Send one request to the order database's maintenance function; its answer."""
    response = boto3.client("lambda").invoke(FunctionName=function_name, Payload=json.dumps(request).encode())
    answer = json.loads(response["Payload"].read() or b"null")
    if "FunctionError" in response or not isinstance(answer, dict):
        raise OrderStoreFunctionError(f"{function_name} failed: {json.dumps(answer)[:1000]}")
    if isinstance(answer.get("error"), dict):
        raise OrderStoreFunctionError(
            f"{function_name} refused the request: {answer['error'].get('message')}"
        )
    return answer


def _maintenance_function(args: argparse.Namespace, *, required: bool) -> str | None:
    """The order database's maintenance function: --order-store-function, or the stack's output."""
    if getattr(args, "order_store_function", None):
        return str(args.order_store_function)
    if args.stack_name:
        found = stack_outputs(args.stack_name).get("OrderStoreMaintenanceFunctionName")
        if found or not required:
            return found
        raise SystemExit(f"error: stack {args.stack_name} has no order database (OrderStore=postgres)")
    if required:
        raise SystemExit("error: give --stack-name, --local or --order-store-function (OrderStore=postgres)")
    return None


def _ask_order_store(function_name: str, request: dict[str, Any]) -> dict[str, Any] | None:
    """The function's answer, printed as the command's report; None (said on stderr) when it failed."""
    try:
        answer = invoke_order_store(function_name, request)
    except OrderStoreFunctionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
    print(json.dumps({"store": "postgres", "function": function_name, **answer}))
    return answer


def _print(report: RecoveryReport, **extra: Any) -> None:
    print(json.dumps({**extra, **vars(report), "complete": report.complete}))


def _drain_queue(
    queue_url: str, max_messages: int, recover: Callable[[dict[str, Any]], RecoveryReport | None]
) -> int:
    """Hand each message to `recover`; delete it only when its report is complete. Exit 1 when a
    message is kept or an event was parked (deleted with its message, but not on the bus)."""
    sqs = aws.sqs()
    run = QueueRun(sqs, queue_url)
    handled = 0
    kept = 0
    parked: list[str] = []
    try:
        while handled + kept < max_messages:
            messages = run.receive(min(10, max_messages - handled - kept))
            if not messages:
                break
            for message in messages:
                if _recover_one(sqs, queue_url, message, recover, parked):
                    handled += 1
                else:
                    kept += 1
                    run.keep(message)
    finally:
        run.end()
    print(json.dumps({"redriven": handled, "kept": kept, "parked": parked}))
    if kept:
        print(f"error: {kept} message(s) kept in {queue_url}: see their 'missing' above", file=sys.stderr)
    if parked:
        print(
            f"error: {len(parked)} event(s) parked in the relay poison queue, not on the bus: "
            f"{', '.join(parked)}; fix why they failed, then run redrive-poison",
            file=sys.stderr,
        )
    return 0 if kept == 0 and not parked else 1


def _recover_one(
    sqs: Any,
    queue_url: str,
    message: Any,
    recover: Callable[[dict[str, Any]], RecoveryReport | None],
    parked: list[str],
) -> bool:
    """One message handed to `recover`: True when its report is complete and the message is deleted."""
    try:
        report = recover(json.loads(message["Body"]))
    except (InvalidEnvelope, ValueError, KeyError, TypeError, RecursionError) as exc:
        report = None
        print(json.dumps({"messageId": message["MessageId"], "error": f"unreadable message: {exc}"}))
    except (ClientError, BotoCoreError) as exc:
        # One message's AWS failure never stops the others; this one stays for a later run.
        report = None
        print(json.dumps({"messageId": message["MessageId"], "error": f"AWS call failed: {exc}"}))
    except Exception as exc:  # noqa: BLE001
        # Whatever a message holds, the others are still redriven; this one stays, named.
        report = None
        error = f"could not redrive: {type(exc).__name__}: {str(exc)[:500]}"
        print(json.dumps({"messageId": message["MessageId"], "error": error}))
    if report is None:
        return False
    _print(report, messageId=message["MessageId"])
    parked.extend(report.poison)
    if not report.complete:
        return False
    try:
        sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
    except (ClientError, BotoCoreError) as exc:
        # Done, but still in the queue: kept, so the next run redrives it again (consumers absorb that).
        error = f"redriven, but not deleted from the queue: {exc}"
        print(json.dumps({"messageId": message["MessageId"], "error": error}))
        return False
    return True


def redrive(args: argparse.Namespace) -> int:
    recovery = _recovery(args)
    return _drain_queue(
        _resolve(args, "queue_url", "RelayDeadLetterQueueUrl"),
        args.max_messages,
        lambda body: recovery.redrive(FailedStreamBatch.from_message(body)),
    )


def redrive_dead_letters(args: argparse.Namespace) -> int:
    """A consumer's dead-letter queue back to its source queue (operations/dead_letters.py)."""
    if args.queue_url:
        dead_letter_queue = str(args.queue_url)
    elif args.stack_name and args.consumer:
        dead_letter_queue = stack_output(args.stack_name, f"{args.consumer}DeadLetterQueueUrl")
    else:
        raise SystemExit("error: give --queue-url, or --stack-name (or --local) and --consumer")
    sqs = aws.sqs()
    try:
        destination = args.to_queue_url or source_queue(sqs, dead_letter_queue)
    except NoDestination as exc:
        raise SystemExit(f"error: {exc}") from exc
    oldest_safe = None
    if not args.include_expired:
        retention = sqs.get_queue_attributes(QueueUrl=destination, AttributeNames=["MessageRetentionPeriod"])
        kept_for = int(retention["Attributes"]["MessageRetentionPeriod"])
        remembered = settings_of(args).idempotency_expires_after_seconds
        oldest_safe = datetime.now(UTC) - timedelta(seconds=remembered - kept_for)
    summary = move_messages(sqs, dead_letter_queue, destination, args.max_messages, oldest_safe=oldest_safe)
    print(json.dumps(summary.closing()))
    if summary.kept:
        print(
            f"error: {summary.kept} message(s) kept in {dead_letter_queue}: see their 'error' above",
            file=sys.stderr,
        )
    return 0 if summary.kept == 0 else 1


def redrive_poison(args: argparse.Namespace) -> int:
    """The poison queue's messages; with OrderStore=postgres each parked row is redriven from the order
    database (whatever its message holds; marked redriven there), or with --event-id, rows by event id
    without a message (one no longer in the queue: the database keeps a parked row until it is redriven
    or discarded)."""
    function_name = _maintenance_function(args, required=bool(args.event_id))
    if args.event_id:
        assert function_name is not None
        answer = _ask_order_store(function_name, {"redriveParked": {"eventIds": args.event_id}})
        if answer is not None and not answer.get("complete"):
            print("error: not every event is on the bus again: see the report above", file=sys.stderr)
        return 0 if answer is not None and answer.get("complete") is True else 1
    order_store = None
    if function_name is not None:
        order_store = partial(invoke_order_store, function_name)
    recovery = _recovery(args, order_store)
    return _drain_queue(
        _resolve(args, "poison_queue_url", "RelayPoisonQueueUrl"),
        args.max_messages,
        lambda body: recovery.redrive_parked(checked_poison_message(body)),
    )


def _order_store_function(args: argparse.Namespace) -> str | None:
    """The maintenance function that replays the PostgreSQL order store, when the stack has one."""
    if args.order_store_function:
        return str(args.order_store_function)
    if args.stack_name and not args.table:
        return stack_outputs(args.stack_name).get("OrderStoreMaintenanceFunctionName")
    return None


def _replay_tables(args: argparse.Namespace) -> list[str]:
    """The outbox tables a replay reads: --table, or every outbox table of the stack."""
    if args.table:
        return [str(args.table)]
    if args.stack_name:
        return [stack_output(args.stack_name, output) for output in OUTBOX_TABLE_OUTPUTS]
    return []


def _replay_order_database(function_name: str, request: dict[str, Any]) -> dict[str, Any] | None:
    """OrderStore=postgres: the database is in a private VPC, so the replay runs in the maintenance
    function there (shop.runtime.order_store_replay); this prints its report and returns it (None, said
    on stderr, when the function failed)."""
    response = boto3.client("lambda").invoke(
        FunctionName=function_name, Payload=json.dumps({"replay": request}).encode()
    )
    payload = json.loads(response["Payload"].read() or b"null")
    if "FunctionError" in response or not isinstance(payload, dict):
        print(f"error: {function_name} failed: {json.dumps(payload)[:1000]}", file=sys.stderr)
        return None
    if "error" in payload:
        raise SystemExit(f"error: {payload['error']['message']}")
    print(json.dumps({"store": "postgres", "function": function_name, **payload}))
    return payload


def _time(option: str, text: str | None) -> datetime | None:
    """An option's RFC 3339 time; SystemExit naming the option when it is not one."""
    if text is None:
        return None
    try:
        return parse_time(text)
    except ValueError as exc:
        raise SystemExit(f"error: {option} {text!r} is not an RFC 3339 time with an offset ({exc})") from None


def replay(args: argparse.Namespace) -> int:
    if not args.event_id and not (args.start and args.end):
        raise SystemExit("error: give --event-id, or both --from and --to")
    start, end = _time("--from", args.start), _time("--to", args.end)
    if start is not None and end is not None and start > end:
        raise SystemExit(f"error: --from {args.start} is after --to {args.end}")
    function_name = _order_store_function(args)
    tables = _replay_tables(args)
    if function_name is None and not tables:
        raise SystemExit("error: give --table, --stack-name or --local")
    expired = {"includeExpired": True} if args.include_expired else {}
    if args.event_id:
        return _replay_events(args, tables, function_name, start, end, expired)
    assert start is not None  # both given: checked above
    assert end is not None
    complete = True
    if function_name is not None:
        answer = _replay_order_database(function_name, {"from": args.start, "to": args.end, **expired})
        complete = answer is not None and answer.get("complete") is True
    if tables:
        report = _recovery(args).replay_window(tables, start, end, include_expired=args.include_expired)
        _print(report, tables=tables)
        complete = complete and report.all_on_bus
    return 0 if complete else 1


def _replay_events(
    args: argparse.Namespace,
    tables: list[str],
    function_name: str | None,
    start: datetime | None,
    end: datetime | None,
    expired: dict[str, Any],
) -> int:
    """Each event from the outbox table that holds it; with an order database, those in no table from
    there. One found nowhere is named with every place it was looked for in."""
    wanted = list(dict.fromkeys(args.event_id))
    recovery = _recovery(args) if tables else None
    # With --from/--to: the hours the events' items are looked for in the tables (default: the republish
    # window, OutboxRecovery.find_events)
    search = recovery.find_events(tables, wanted, written_from=start, written_to=end) if recovery else None
    complete = True
    if function_name is not None:
        elsewhere = [e for e in wanted if search is None or e not in search.found]
        if elsewhere:
            answer = _replay_order_database(function_name, {"eventIds": elsewhere, **expired})
            complete = answer is not None and answer.get("complete") is True
            unknown = answer.get("missing") if answer is not None else None
            if unknown and tables:
                print(
                    f"error: not in the order database nor in {' or '.join(tables)} (unknown, or deleted by "
                    f"TTL): {', '.join(map(str, unknown))}",
                    file=sys.stderr,
                )
        wanted = [e for e in wanted if e not in elsewhere]
    if recovery is not None and search is not None and wanted:
        report = recovery.replay_found(search, wanted, include_expired=args.include_expired)
        _print(report, tables=tables)
        complete = complete and report.all_on_bus
    return 0 if complete else 1


def discard_poison(args: argparse.Namespace) -> int:
    """Record that parked rows are never to be published (who: the caller's AWS identity; why: --reason)."""
    function_name = _maintenance_function(args, required=True)
    assert function_name is not None
    by = boto3.client("sts").get_caller_identity()["Arn"]
    request = {"eventIds": args.event_ids, "reason": args.reason, "by": by, "execute": args.execute}
    answer = _ask_order_store(function_name, {"discardParked": request})
    if answer is None:
        return 1
    if answer.get("dryRun"):
        print("dry run: nothing changed; add --execute to discard", file=sys.stderr)
    elif answer.get("discarded"):
        print(
            "discarded; their messages in the relay poison queue go with the next redrive-poison run",
            file=sys.stderr,
        )
    return 0 if answer.get("complete") is True else 1


def recover_slot(args: argparse.Namespace) -> int:
    """PostgresRelay=logical: recreate a lost replication slot and republish the gap from the table."""
    function_name = _maintenance_function(args, required=True)
    assert function_name is not None
    request: dict[str, Any] = {"execute": args.execute, "includeExpired": args.include_expired}
    _time("--since", args.since)
    if args.since:
        request["since"] = args.since
    answer = _ask_order_store(function_name, {"recoverSlot": request})
    if answer is None:
        return 1
    if answer.get("dryRun"):
        print("dry run: nothing changed; add --execute to recover", file=sys.stderr)
        return 0 if answer.get("failed") is None else 1
    if answer.get("complete") is not True:
        print("error: the recovery is not complete: see failed and messages above", file=sys.stderr)
        return 1
    return 0


def seed(args: argparse.Namespace) -> int:
    table = _resolve(args, "table", "InventoryTableName")
    stock = read_seed_file(Path(args.file))
    settings = Settings.from_env({"INVENTORY_TABLE_NAME": table})
    seed_stock(DynamoInventoryRepository(settings), stock)
    print(json.dumps({"table": table, "skus": len(stock)}))
    return 0


def read_seed_file(path: Path) -> list[dict[str, Any]]:
    """A seed file's "stock" lines; SystemExit saying what is wrong with it."""
    try:
        stock = json.loads(path.read_text())["stock"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"error: {path} is not a seed file: {exc}") from None
    if not isinstance(stock, list) or not all(
        isinstance(line, dict) and isinstance(line.get("sku"), str) and type(line.get("available")) is int
        for line in stock
    ):
        raise SystemExit(
            f'error: {path} is not a seed file: "stock" must list {{"sku": text, "available": integer}}'
        )
    return stock


def seed_stock(repository: DynamoInventoryRepository, stock: list[dict[str, Any]]) -> None:
    """Set the available stock of each SKU listed in a seed file's "stock" section."""
    for line in stock:
        repository.set_stock(str(line["sku"]), int(line["available"]))


def _add_common_options(parser: argparse.ArgumentParser, default: Any = None) -> None:
    """The options every command reads: where the names come from, and the bus and poison queue."""
    parser.add_argument(
        "--stack-name", default=default, help="read names from this CloudFormation stack's outputs"
    )
    parser.add_argument(
        "--local",
        action="store_true",
        default=False if default is None else default,
        help="act on the running local stack (make local) on port PORT (default 3000) instead: its outputs "
        "and endpoints (operations/local_stack.py)",
    )
    parser.add_argument("--bus", default=default, help="event bus name (default: stack output EventBusName)")
    parser.add_argument(
        "--poison-queue-url", default=default, help="default: stack output RelayPoisonQueueUrl"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    _add_common_options(parser)
    commands = parser.add_subparsers(dest="command", required=True)
    # The common options are taken after the command too (`redrive --stack-name NAME`); given there, they
    # win; not given there, they leave what was given before the command alone (SUPPRESS).
    common = argparse.ArgumentParser(add_help=False)
    _add_common_options(common, default=argparse.SUPPRESS)

    def command(name: str, **options: Any) -> argparse.ArgumentParser:
        return commands.add_parser(name, parents=[common], **options)

    p_redrive = command("redrive", help="republish the batches in the relay dead-letter queue")
    p_redrive.add_argument("--queue-url", help="default: stack output RelayDeadLetterQueueUrl")
    p_redrive.add_argument("--max-messages", type=int, default=1000)
    p_redrive.set_defaults(run=redrive)
    p_dlq = command(
        "redrive-dlq",
        help="move a consumer dead-letter queue's messages back to its queue (as SQS's DLQ redrive does)",
    )
    p_dlq.add_argument("--queue-url", help="the dead-letter queue")
    p_dlq.add_argument(
        "--consumer",
        choices=CONSUMERS,
        help="with --stack-name: the consumer whose dead-letter queue it is (stack output "
        "<consumer>DeadLetterQueueUrl: Inventory, OrderStatus, Notification)",
    )
    p_dlq.add_argument(
        "--to-queue-url", help="where to move them (default: the queue whose dead-letter queue it is)"
    )
    p_dlq.add_argument("--max-messages", type=int, default=1000)
    p_dlq.add_argument(
        "--include-expired",
        action="store_true",
        help="also move messages whose event is older than the consumers would still remember once "
        "delivered (OutboxTtlDays + 19 days, less the queue's retention): a notification may repeat",
    )
    p_dlq.set_defaults(run=redrive_dead_letters)
    p_poison = command(
        "redrive-poison", help="republish records the relay parked (after fixing why they failed)"
    )
    p_poison.add_argument("--max-messages", type=int, default=1000)
    p_poison.add_argument(
        "--order-store-function",
        help="OrderStore=postgres: the maintenance function that redrives parked rows from the order "
        "database (default: stack output OrderStoreMaintenanceFunctionName, when the stack has one)",
    )
    p_poison.add_argument(
        "--event-id",
        action="append",
        help="OrderStore=postgres: redrive this parked row from the order database, not from a queue message "
        "(repeatable)",
    )
    p_poison.set_defaults(run=redrive_poison)
    p_discard = command(
        "discard-poison",
        help="OrderStore=postgres: record that parked rows are never to be published (a dry run unless "
        "--execute)",
    )
    p_discard.add_argument("event_ids", nargs="+", metavar="EVENT_ID")
    p_discard.add_argument("--reason", required=True, help="why they are never to be published (recorded)")
    p_discard.add_argument("--execute", action="store_true", help="discard (without it: what would be done)")
    p_discard.add_argument(
        "--order-store-function", help="default: stack output OrderStoreMaintenanceFunctionName"
    )
    p_discard.set_defaults(run=discard_poison)
    p_slot = command(
        "recover-slot",
        help="PostgresRelay=logical: recreate a lost replication slot and republish the gap (dry run unless "
        "--execute)",
    )
    p_slot.add_argument(
        "--since",
        help="RFC 3339: republish rows from here (default: the last delivered position the database "
        "recorded, less an hour; without one, the republish window)",
    )
    p_slot.add_argument(
        "--include-expired",
        action="store_true",
        help="also republish gap rows created before the republish window (consumers may no longer "
        "remember them)",
    )
    p_slot.add_argument("--execute", action="store_true", help="recover (without it: what would be done)")
    p_slot.add_argument(
        "--order-store-function", help="default: stack output OrderStoreMaintenanceFunctionName"
    )
    p_slot.set_defaults(run=recover_slot)
    p_replay = command(
        "replay", help="republish outbox events from the outbox tables (and the order database, if any)"
    )
    p_replay.add_argument(
        "--table",
        help="only this outbox table (default: every outbox table of the stack, outputs "
        f"{' and '.join(OUTBOX_TABLE_OUTPUTS)}, and with OrderStore=postgres the order database)",
    )
    p_replay.add_argument(
        "--order-store-function",
        help="OrderStore=postgres: the maintenance function that replays the order database "
        "(default: stack output OrderStoreMaintenanceFunctionName, when the stack has one)",
    )
    p_replay.add_argument(
        "--from",
        dest="start",
        help="RFC 3339 start of the window (inclusive); with --event-id (DynamoDB), of the hours the events "
        "are looked for in (default: the republish window)",
    )
    p_replay.add_argument("--to", dest="end", help="RFC 3339 end of the window (inclusive)")
    p_replay.add_argument("--event-id", action="append", help="republish this event (repeatable)")
    p_replay.add_argument(
        "--include-expired",
        action="store_true",
        help="also republish events past their expiresAt, which consumers may no longer remember",
    )
    p_replay.set_defaults(run=replay)
    p_seed = command("seed", help="set stock levels from a seed file")
    p_seed.add_argument("--table", help="default: stack output InventoryTableName")
    p_seed.add_argument("--file", default="tools/local/seed.json", help='{"stock": [{"sku", "available"}]}')
    p_seed.set_defaults(run=seed)
    args = parser.parse_args(argv)
    forget_stacks()
    if args.local:
        local_stack.use_local_stack(args)
    try:
        return int(args.run(args))
    except NoRegionError:
        raise SystemExit(
            "error: no AWS region: set the region of your profile (aws configure, or AWS_PROFILE) or "
            "AWS_DEFAULT_REGION to the stack's; or act on the local stack with --local"
        ) from None
