"""The harness's hands on the bus: capture everything published, and deliver some events twice, late.

- BusCapture: rules on the bus that together match every event, each into a capture queue drained by a
  thread of its own: every event put on the bus, with how many times it was put there and the rank of
  its first arrival (the bus delivers to the queue inside PutEvents and the queue keeps their order:
  arrival order is put order; an order's events all go to one queue).
- NotificationCapture: the topic's capture queue (the local stack subscribes one to every topic).
- Duplicator: for each consumer rule, an extra rule with the same pattern narrowed to a subset of event
  ids (detail.id prefixes), whose target is a chaos delay queue; a thread moves each message into the
  consumer's queue a few seconds later. The consumer gets those events twice, the copy late and out of
  order with what came since: the duplicate delivery and reordering EventBridge and SQS allow.
"""

from __future__ import annotations

import functools
import heapq
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from tools.chaos.ledger import Ledger
from tools.chaos.plan import BUS_DUPLICATE, seeded_rng
from tools.local.stack import LocalStack

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.literals import QueueAttributeNameType
    from mypy_boto3_sqs.type_defs import MessageTypeDef

_WAIT_SECONDS = 1
_HEX = "0123456789abcdef"
_ERROR_PAUSE_SECONDS = 0.5


def _queue(sqs: SQSClient, name: str) -> tuple[str, str]:
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    return url, arn


def queue_depth(sqs: SQSClient, url: str) -> int:
    """Messages in a queue, visible, in flight or delayed."""
    names: list[QueueAttributeNameType] = [
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesNotVisible",
        "ApproximateNumberOfMessagesDelayed",
    ]
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
    return sum(int(attributes.get(name, "0")) for name in names)


class _Drainer:
    """A thread that long-polls one queue, hands each message to `handle` and deletes it."""

    def __init__(
        self,
        sqs: SQSClient,
        url: str,
        name: str,
        handle: Callable[[MessageTypeDef], None],
        tick: Callable[[], None] | None = None,
    ) -> None:
        self._sqs = sqs
        self._url = url
        self._handle = handle
        self._tick = tick
        self._stop = threading.Event()
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=_WAIT_SECONDS + 5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                messages = self._sqs.receive_message(
                    QueueUrl=self._url,
                    MaxNumberOfMessages=10,
                    WaitTimeSeconds=_WAIT_SECONDS,
                    MessageSystemAttributeNames=["SentTimestamp"],
                ).get("Messages", [])
                for message in messages:
                    self._handle(message)
                if messages:
                    self._sqs.delete_message_batch(
                        QueueUrl=self._url,
                        Entries=[
                            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                            for i, m in enumerate(messages)
                        ],
                    )
                if self._tick is not None:
                    self._tick()  # after every receive, also an empty one
            except (ClientError, BotoCoreError, ValueError) as exc:
                if self._stop.is_set():
                    return
                self.errors.append(repr(exc))
                self._stop.wait(_ERROR_PAUSE_SECONDS)


@dataclass
class CapturedEvent:
    detail: dict[str, Any]
    deliveries: int = 0
    first_at: float = field(default_factory=time.time)
    first_arrival: int = 0  # rank among the events captured (0 first)
    # Its latest arrival in the capture queue (a replay's, say): when the bus sent it there, not when the
    # harness read it (the capture may lag behind).
    last_at: float = 0.0


class _Drained:
    """Queues read by background drainers; subclasses set `_drainers` and handle messages."""

    _drainers: list[_Drainer]

    def start(self) -> None:
        for drainer in self._drainers:
            drainer.start()

    def stop(self) -> None:
        for drainer in self._drainers:
            drainer.stop()

    @property
    def errors(self) -> list[str]:
        return [error for drainer in self._drainers for error in drainer.errors]


class _QueueCapture(_Drained):
    """Capture queues: what they hold not read yet is the capture's backlog."""

    queue_urls: list[str]

    def backlog(self, sqs: SQSClient) -> int:
        """Messages in the capture queues not read yet."""
        return sum(queue_depth(sqs, url) for url in self.queue_urls)


def capture_patterns() -> list[list[dict[str, Any]]]:
    """The capture's rules, by queue: together they match every event once. Each queue takes a share of
    the orders (the subject's first hex digit), so each stays short: moto's every SQS receive and delete
    costs time in proportion to the queue's length, and a replay puts thousands of events on the bus at
    once. The last takes the rest: any other subject, and none."""
    shares = [f"o-{digit}" for digit in _HEX]
    patterns: list[list[dict[str, Any]]] = [
        [{"detail": {"subject": [{"prefix": p} for p in shares[start : start + 4]]}}]
        for start in range(0, len(shares) - 4, 4)
    ]
    covered = shares[: 4 * len(patterns)]
    patterns.append(
        [
            {"detail": {"subject": [{"anything-but": {"prefix": covered}}]}},
            {"detail": {"subject": [{"exists": False}]}},
        ]
    )
    return patterns


class BusCapture(_QueueCapture):
    """Every event put on the bus, by CloudEvent id."""

    def __init__(self, stack: LocalStack, bus_name: str, prefix: str) -> None:
        self._lock = threading.Lock()
        self.events: dict[str, CapturedEvent] = {}
        self.foreign: list[str] = []  # bus events whose detail is not a CloudEvent with an id
        sqs = stack.clients.sqs()
        events = stack.clients.events()
        self.queue_urls, self._drainers = [], []
        for number, patterns in enumerate(capture_patterns(), start=1):
            url, arn = _queue(sqs, f"{prefix}-bus-capture-{number}")
            for rule_number, pattern in enumerate(patterns, start=1):
                rule = f"{prefix}-capture-{number}-{rule_number}"
                events.put_rule(Name=rule, EventBusName=bus_name, EventPattern=json.dumps(pattern))
                events.put_targets(Rule=rule, EventBusName=bus_name, Targets=[{"Id": "capture", "Arn": arn}])
            self.queue_urls.append(url)
            self._drainers.append(_Drainer(sqs, url, f"chaos-bus-capture-{number}", self._on_message))

    def _on_message(self, message: MessageTypeDef) -> None:
        body = json.loads(message["Body"])
        detail = body.get("detail") if isinstance(body, dict) else None
        event_id = detail.get("id") if isinstance(detail, dict) else None
        with self._lock:
            if not isinstance(event_id, str) or not isinstance(detail, dict):
                self.foreign.append(message["Body"][:500])
                return
            captured = self.events.get(event_id)
            if captured is None:
                captured = self.events[event_id] = CapturedEvent(detail, first_arrival=len(self.events))
            captured.deliveries += 1
            sent = int(message.get("Attributes", {}).get("SentTimestamp", 0)) / 1000
            captured.last_at = max(captured.last_at, sent or time.time())

    def seen(self) -> set[str]:
        with self._lock:
            return set(self.events)

    def snapshot(self) -> dict[str, CapturedEvent]:
        with self._lock:
            return dict(self.events)


class NotificationCapture(_QueueCapture):
    """Every message published to a topic of the stack, as its JSON message."""

    def __init__(self, stack: LocalStack, topic: str) -> None:
        self._lock = threading.Lock()
        self.messages: list[dict[str, Any]] = []
        self.unreadable: list[str] = []
        self.queue_urls = [stack.capture_queue_url(topic)]
        self._drainers = [
            _Drainer(stack.clients.sqs(), self.queue_urls[0], "chaos-notifications", self._on_message)
        ]

    def _on_message(self, message: MessageTypeDef) -> None:
        envelope = json.loads(message["Body"])
        try:
            published = json.loads(envelope["Message"])
        except (KeyError, TypeError, ValueError):
            with self._lock:
                self.unreadable.append(message["Body"][:500])
            return
        with self._lock:
            self.messages.append(published)

    def by_event_id(self) -> Counter[str]:
        with self._lock:
            return Counter(str(m.get("eventId")) for m in self.messages)


@dataclass(order=True)
class _Held:
    due: float
    sequence: int
    target_url: str = field(compare=False)
    body: str = field(compare=False)
    event_id: str = field(compare=False)
    function: str = field(compare=False)


@dataclass(frozen=True)
class DuplicateRoute:
    rule: str  # logical id of the consumer's rule
    queue: str  # logical id of its target queue
    function: str  # the consumer reading that queue


class Duplicator(_Drained):
    """Late second deliveries of a subset of each consumer's events (see the module docstring)."""

    def __init__(
        self,
        stack: LocalStack,
        routes: list[DuplicateRoute],
        *,
        prefix: str,
        seed: int,
        ledger: Ledger,
        id_prefixes: int,
        delay_seconds: tuple[float, float],
    ) -> None:
        self._ledger = ledger
        self._delay = delay_seconds
        self._rng = seeded_rng(seed, "bus")
        self._lock = threading.Lock()
        self._held: list[_Held] = []
        self._sequence = 0
        self.sent = 0
        self._sqs = stack.clients.sqs()
        self._drainers: list[_Drainer] = []
        self.delay_queue_urls: list[str] = []
        events = stack.clients.events()
        hex_digits = "0123456789abcdef"
        for route in routes:
            props = stack.template.properties(route.rule)
            bus = str(props.get("EventBusName", "default")).rsplit("event-bus/", 1)[-1]
            pattern = dict(props["EventPattern"])
            chosen = self._rng.sample(hex_digits, id_prefixes)
            pattern["detail"] = {**pattern.get("detail", {}), "id": [{"prefix": p} for p in chosen]}
            url, arn = _queue(self._sqs, f"{prefix}-dup-{route.queue}")
            name = f"{prefix}-dup-{route.rule}"
            events.put_rule(Name=name, EventBusName=bus, EventPattern=json.dumps(pattern))
            events.put_targets(Rule=name, EventBusName=bus, Targets=[{"Id": "delay", "Arn": arn}])
            target = stack.queue_url(route.queue)
            self.delay_queue_urls.append(url)
            drainer = _Drainer(
                stack.clients.sqs(),
                url,
                f"chaos-dup-{route.queue}",
                functools.partial(self._hold, target_url=target, function=route.function),
                tick=self._release,
            )
            self._drainers.append(drainer)

    def held(self) -> int:
        with self._lock:
            return len(self._held)

    def _hold(self, message: MessageTypeDef, target_url: str, function: str) -> None:
        body = message["Body"]
        event_id = str(json.loads(body).get("detail", {}).get("id"))
        with self._lock:
            self._sequence += 1
            due = time.monotonic() + self._rng.uniform(*self._delay)
            heapq.heappush(self._held, _Held(due, self._sequence, target_url, body, event_id, function))

    def _release(self) -> None:
        while True:
            with self._lock:
                if not self._held or self._held[0].due > time.monotonic():
                    return
                held = heapq.heappop(self._held)
            self._sqs.send_message(QueueUrl=held.target_url, MessageBody=held.body)
            with self._lock:
                self.sent += 1
            self._ledger.append(
                BUS_DUPLICATE, held.function, "SendMessage", event_ids=[held.event_id], delivered="late copy"
            )
