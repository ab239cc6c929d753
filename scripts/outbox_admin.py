"""Operator commands for the outbox: redrive the relay dead-letter queue, replay events from the table.

    python scripts/outbox_admin.py redrive --stack-name NAME            # or --queue-url/--bus
    python scripts/outbox_admin.py replay --stack-name NAME --from 2026-11-21T10:00:00Z --to ...
    python scripts/outbox_admin.py replay --stack-name NAME --event-id ID [--event-id ID ...]
    python scripts/outbox_admin.py seed --stack-name NAME --file local/seed.json

Names come from the stack's outputs (--stack-name) or are given explicitly. Republishing is safe:
every consumer deduplicates on the CloudEvent id.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "layers" / "shared"))

import boto3

from shop import aws
from shop.config import Settings
from shop.envelope import parse_time
from shop.errors import InvalidEnvelope
from shop.inventory_repository import DynamoInventoryRepository
from shop.publisher import EventPublisher
from shop.recovery import FailedStreamBatch, OutboxRecovery, RecoveryReport


def stack_outputs(stack_name: str) -> dict[str, str]:
    stack = boto3.client("cloudformation").describe_stacks(StackName=stack_name)["Stacks"][0]
    return {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}


def _resolve(args: argparse.Namespace, attribute: str, output: str) -> str:
    value = getattr(args, attribute)
    if value:
        return str(value)
    if args.stack_name:
        return stack_outputs(args.stack_name)[output]
    raise SystemExit(f"error: give --{attribute.replace('_', '-')} or --stack-name")


def _recovery(args: argparse.Namespace) -> OutboxRecovery:
    settings = Settings.from_env()
    bus = _resolve(args, "bus", "EventBusName")
    return OutboxRecovery(
        EventPublisher(bus, settings.max_event_bytes), settings.max_event_bytes, settings.outbox_time_shards
    )


def _print(report: RecoveryReport, **extra: Any) -> None:
    print(json.dumps({**extra, **vars(report), "complete": report.complete}))


def redrive(args: argparse.Namespace) -> int:
    queue_url = _resolve(args, "queue_url", "RelayDeadLetterQueueUrl")
    recovery = _recovery(args)
    sqs = aws.sqs()
    handled = 0
    failed = 0
    while handled + failed < args.max_messages:
        messages = sqs.receive_message(
            QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1, VisibilityTimeout=120
        ).get("Messages", [])
        if not messages:
            break
        for message in messages:
            try:
                batch = FailedStreamBatch.from_message(json.loads(message["Body"]))
            except (InvalidEnvelope, json.JSONDecodeError):
                print(json.dumps({"messageId": message["MessageId"], "error": "not a stream failure record"}))
                failed += 1
                continue
            report = recovery.redrive(batch)
            _print(report, messageId=message["MessageId"], shard=batch.shard_id)
            if report.complete or (args.drop_poison and not report.unpublished):
                sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
                handled += 1
            else:
                failed += 1  # stays in the queue (visible again after the visibility timeout)
    print(json.dumps({"redriven": handled, "kept": failed}))
    return 0 if failed == 0 else 1


def replay(args: argparse.Namespace) -> int:
    table = _resolve(args, "table", "OrdersTableName")
    recovery = _recovery(args)
    if args.event_id:
        report = recovery.replay_events(table, args.event_id)
    elif args.start and args.end:
        report = recovery.replay_window(table, parse_time(args.start), parse_time(args.end))
    else:
        raise SystemExit("error: give --event-id, or both --from and --to")
    _print(report, table=table)
    return 0 if report.complete else 1


def seed(args: argparse.Namespace) -> int:
    table = _resolve(args, "table", "InventoryTableName")
    stock = json.loads(Path(args.file).read_text())["stock"]
    settings = Settings.from_env({"INVENTORY_TABLE_NAME": table})
    seed_stock(DynamoInventoryRepository(settings), stock)
    print(json.dumps({"table": table, "skus": len(stock)}))
    return 0


def seed_stock(repository: DynamoInventoryRepository, stock: list[dict[str, Any]]) -> None:
    """Set the available stock of each SKU listed in a seed file's "stock" section."""
    for line in stock:
        repository.set_stock(str(line["sku"]), int(line["available"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--stack-name", help="read names from this CloudFormation stack's outputs")
    parser.add_argument("--bus", help="event bus name (default: stack output EventBusName)")
    commands = parser.add_subparsers(dest="command", required=True)
    p_redrive = commands.add_parser("redrive", help="republish the batches in the relay dead-letter queue")
    p_redrive.add_argument("--queue-url", help="default: stack output RelayDeadLetterQueueUrl")
    p_redrive.add_argument("--max-messages", type=int, default=1000)
    p_redrive.add_argument(
        "--drop-poison", action="store_true", help="delete a message even if it held undecodable items"
    )
    p_redrive.set_defaults(run=redrive)
    p_replay = commands.add_parser("replay", help="republish outbox events from a table")
    p_replay.add_argument("--table", help="default: stack output OrdersTableName")
    p_replay.add_argument("--from", dest="start", help="RFC 3339 start of the window (inclusive)")
    p_replay.add_argument("--to", dest="end", help="RFC 3339 end of the window (inclusive)")
    p_replay.add_argument("--event-id", action="append", help="republish this event (repeatable)")
    p_replay.set_defaults(run=replay)
    p_seed = commands.add_parser("seed", help="set stock levels from a seed file")
    p_seed.add_argument("--table", help="default: stack output InventoryTableName")
    p_seed.add_argument("--file", default="local/seed.json", help='{"stock": [{"sku", "available"}]}')
    p_seed.set_defaults(run=seed)
    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    raise SystemExit(main())
