"""moto server with two corrections to moto's SQS (serialise_sqs_deletes, read_retention_per_message)
and one behaviour of EventBridge moto lacks (pass_trace_headers_to_sqs_targets): `python -m moto.server`
plus those three.

Started by tools.local.services.emulators as
`python -m tools.local.services.moto_server -H 127.0.0.1 -p PORT` (the arguments of
`python -m moto.server`). Otherwise moto runs as released: the stack is for fidelity, not speed.

What is not patched, and why (docs/performance.md has the measurements that once justified patching):
- moto's per-request CPU (JSONPath parsed per event target, URL dispatch per request, SQS clock reads
  per message, an SNS signing certificate built per message): each patch gave the same answers faster,
  which only the local throughput figures needed. The one exception, read_retention_per_message, is not
  a constant factor: it is a receive whose cost grows with the square of the queue's depth, which
  stalled a chaos run.
- Werkzeug closes the connection after every response, where AWS endpoints keep HTTP/1.1 connections
  alive and the SDK reuses them. Keeping them alive here meant replacing Werkzeug's request handler
  and the `selectors` module its server drains request bodies with: a rewrite of how requests are
  framed, a larger risk to fidelity than the difference it removes, which nothing the stack emulates
  depends on (botocore opens a new connection when the last one was closed, and the functions' code
  never sees connections). It was kept for CPU, so it went with the other speed-ups.
- Werkzeug's access log stays (it was silenced for CPU): a line per request in moto's log file, not on
  the console, with its time and status (JSON-protocol calls all read `POST /`); about 2 MB for a
  2,000-order `make chaos`.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from typing import Any


def serialise_sqs_deletes() -> None:
    """moto's Queue.delete_message rebuilds the queue's message list outside the lock that guards
    appends. Two deletes at once (concurrent batches) with a send in between lose the sent message and
    bring the other deleted one back: a chaos run lost 1 of 3,000 OrderCreated events on the inventory
    queue this way. Deletes take the queue's lock here, so they and sends are serialised."""
    from moto.sqs.models import Queue

    delete_message: Callable[[Any, str], None] = Queue.delete_message

    @functools.wraps(delete_message)
    def locked_delete_message(self: Any, receipt_handle: str) -> None:
        with self._messages_lock:  # a Condition over an RLock: re-entrant
            delete_message(self, receipt_handle)

    Queue.delete_message = locked_delete_message  # type: ignore[method-assign]


def read_retention_per_message() -> None:
    """moto checks each message it receives against the queue's retention period by building every
    attribute of the queue (SQSBackend.is_message_valid_based_on_retention_period calls
    get_queue_attributes, whose Queue.attributes counts the queue's visible, in-flight and delayed
    messages), so one receive from a queue of n messages costs O(n^2). A 2,000-order chaos run with the
    logical relay stalled on it once a replay had filled the consumers' queues with a few thousand
    messages: moto at 83% of a core answering 150 requests a minute, the functions' calls timing out
    (2026-11-26). The check here reads the one attribute; its answer is moto's (a message sent longer ago
    than the queue's MessageRetentionPeriod is not received)."""
    from moto.core.utils import unix_time
    from moto.sqs.models import Message, SQSBackend

    def is_message_valid_based_on_retention_period(self: Any, queue_name: str, message: Message) -> bool:
        retention_period = int(self.get_queue(queue_name).message_retention_period)
        return bool(retention_period + message.sent_timestamp / 1000 > unix_time())  # type: ignore[operator]

    SQSBackend.is_message_valid_based_on_retention_period = (  # type: ignore[method-assign]
        is_message_valid_based_on_retention_period
    )


_put_events_entry = threading.local()


def pass_trace_headers_to_sqs_targets() -> None:
    """EventBridge passes a PutEvents entry's TraceHeader to its targets; an SQS target gets it as the
    message's AWSTraceHeader system attribute, not in the event (EventBridge user guide, "Amazon
    EventBridge integration with AWS X-Ray": "EventBridge passes the original trace header to the
    target"; "The trace header is not available on the event that's delivered to the invocation
    target"). moto drops it; the saga's one trace (shop.runtime.trace_context) depends on it, so each
    entry is put on its own here with its header in a thread-local, which the SQS send of its delivery
    reads (an SQS SendMessage from a client runs in another request's thread and never sees it).
    tests/conformance/test_trace_propagation.py checks it."""
    from moto.events.models import EventsBackend
    from moto.sqs.models import SQSBackend

    put_events = EventsBackend.put_events
    send_message = SQSBackend.send_message

    @functools.wraps(put_events)
    def put_events_one_by_one(self: Any, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        results: list[dict[str, Any]] = []
        for entry in events:
            _put_events_entry.trace_header = entry.get("TraceHeader")
            try:
                results.extend(put_events(self, [entry]))
            finally:
                _put_events_entry.trace_header = None
        return results

    @functools.wraps(send_message)
    def send_message_with_trace_header(self: Any, *args: Any, **kwargs: Any) -> Any:
        header = getattr(_put_events_entry, "trace_header", None)  # set only while this thread delivers
        if header and not kwargs.get("system_attributes"):
            kwargs["system_attributes"] = {"AWSTraceHeader": {"DataType": "String", "StringValue": header}}
        return send_message(self, *args, **kwargs)

    EventsBackend.put_events = put_events_one_by_one  # type: ignore[method-assign]
    SQSBackend.send_message = send_message_with_trace_header  # type: ignore[method-assign]


def main(argv: list[str]) -> None:
    serialise_sqs_deletes()
    read_retention_per_message()
    pass_trace_headers_to_sqs_targets()
    from moto import server

    server.main(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
