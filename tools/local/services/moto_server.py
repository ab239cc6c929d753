"""moto server with two corrections to moto's SQS (serialise_sqs_deletes, read_queue_attributes_on_demand),
one to its EventBridge (parse_each_input_path_once) and one behaviour of EventBridge moto lacks
(pass_trace_headers_to_sqs_targets): `python -m moto.server` plus those four.

Started by tools.local.services.emulators as
`python -m tools.local.services.moto_server -H 127.0.0.1 -p PORT` (the arguments of
`python -m moto.server`). Otherwise moto runs as released: the stack is for fidelity, not speed.

What is not patched, and why (docs/performance.md has the measurements that once justified patching):
- moto's per-request CPU (URL dispatch per request, SQS clock reads per message, an SNS signing
  certificate built per message): each patch gave the same answers faster, which only the local
  throughput figures needed. Two came back because a 2,000-order chaos run stalled without them, not for
  speed records: read_queue_attributes_on_demand (a send whose cost grows with the queue's depth, a
  receive with its square) and parse_each_input_path_once (eight JSONPath expressions parsed, parser
  and all, per event and target: moto could not deliver a replay as fast as the relays
  sent it, the relays' calls timed out and were sent again, and the retries buried moto).
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
import json
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
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


class _QueueAttributes(Mapping[str, Any]):
    """Queue.attributes with each value built when it is read: the same keys, values and order as
    moto's property (BASE_ATTRIBUTES, then FIFO_ATTRIBUTES on a FIFO queue, KMS_ATTRIBUTES with a key;
    Policy and RedrivePolicy as moto renders them; booleans as "true"/"false")."""

    def __init__(self, queue: Any) -> None:
        self._queue = queue

    def _names(self) -> list[str]:
        queue = self._queue
        return (
            list(queue.BASE_ATTRIBUTES)
            + (list(queue.FIFO_ATTRIBUTES) if queue.fifo_queue else [])
            + (list(queue.KMS_ATTRIBUTES) if queue.kms_master_key_id else [])
        )

    def __getitem__(self, name: str) -> Any:
        from moto.core.utils import camelcase_to_underscores

        if name not in self._names():
            raise KeyError(name)
        queue = self._queue
        if name == "RedrivePolicy" and queue.redrive_policy:
            return json.dumps(queue.redrive_policy)
        value = getattr(queue, camelcase_to_underscores(name))
        return str(value).lower() if isinstance(value, bool) else value

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())


def read_queue_attributes_on_demand() -> None:
    """moto's Queue.attributes builds every attribute of the queue whenever one is read, and three of
    them count the queue's visible, in-flight and delayed messages. moto reads it on every SendMessage
    (ContentBasedDeduplication) and on every message received (the retention check reads
    MessageRetentionPeriod through get_queue_attributes), so a send to a queue of n messages costs O(n)
    and a receive O(n^2): 60 ms a send at 5,000 messages. A 2,000-order chaos run with the logical
    relay stalled on it once a replay had filled the consumers' queues with a few thousand messages:
    moto at 83% of a core answering 150 requests a minute, the functions' calls timing out
    (2026-11-26). Here each value is built when it is read; the answers are moto's (a unit test
    compares them, queue by queue)."""
    from moto.sqs.models import Queue

    Queue.attributes = property(_QueueAttributes)  # type: ignore[assignment,method-assign]


def parse_each_input_path_once() -> None:
    """moto's EventBridge renders the event each target receives through JSONPath expressions (the
    target's InputTransformer's or, without one as here, the eight of its default rendering), parsed again
    for every event and target, and jsonpath_ng builds its whole lexer and parser (ply) for every parse:
    about three quarters of moto's CPU while a replay was delivered, which stalled a 2,000-order chaos run
    with the logical relay (moto at 81% of a core, 800 request threads waiting, 2026-11-26). A parsed
    expression is a pure function of its text, so each text is parsed once here and moto's own matching
    renders every event as before (a unit test compares the rendered targets)."""
    import jsonpath_ng.ext

    ext: Any = jsonpath_ng.ext  # moto imports parse from it at each call
    if not hasattr(ext.parse, "cache_info"):
        ext.parse = functools.lru_cache(maxsize=1024)(ext.parse)


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
    read_queue_attributes_on_demand()
    parse_each_input_path_once()
    pass_trace_headers_to_sqs_targets()
    from moto import server

    server.main(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
