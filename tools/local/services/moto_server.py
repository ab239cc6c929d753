"""moto server with its per-request hot spots cached: same behaviour, a fraction of the CPU under load.

Started by tools.local.services.emulators as
`python -m tools.local.services.moto_server -H 127.0.0.1 -p PORT` (the arguments of
`python -m moto.server`). Profiled under the local stack's load (py-spy), moto spends most of its time
on work that gives the same answer every time:
- EventBridge: for every target of every matching event, moto builds a new JSONPath parser (PLY
  grammar tables included) to read the target's input paths; the parsed expressions are cached here.
- Request routing: every request lists moto's package directory and tries hundreds of URL patterns,
  under a lock that serialises the server's threads; the answer per host is cached here.
- SQS: every receive reads the clock through datetime arithmetic for each message in the queue, and
  computes all queue attributes (three scans) per received message to read its retention period;
  the clock is read with time.time() and the retention period directly here.
- Werkzeug writes an access-log line per request; only warnings and errors are logged here.
- Werkzeug's server closes the connection after every response, so every SDK call paid for a new TCP
  connection and a new server thread; here a request whose body has a Content-Length is read whole
  before moto sees it, and the connection is kept alive (HTTP/1.1), as AWS endpoints keep it.
- SNS: for every message delivered to a subscription, moto builds and signs a new X.509 certificate
  for the same key; the certificate is built once per key here (each message is still signed).
It also corrects a race in moto's SQS that loses messages (serialise_sqs_deletes, never skipped).
Each speed-up is skipped (and said so in the log) when the installed moto no longer has the hook, so a
moto upgrade can make the server slower, never wrong.
"""

from __future__ import annotations

import functools
import importlib
import logging
import socket
import sys
import threading
import time
import types
from collections.abc import Callable
from typing import Any


def _cache_jsonpath_parsing() -> None:
    ext: Any = importlib.import_module("jsonpath_ng.ext")  # moto imports parse from it at each call
    # Parsed expressions are immutable trees; find() keeps no state in them.
    ext.parse = functools.lru_cache(maxsize=1024)(ext.parse)


def _cache_backend_lookup() -> None:
    from moto import backends
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    modules = tuple(backends.list_of_moto_modules())
    backends.list_of_moto_modules = lambda: modules

    lookup: Callable[[Any, str | None], Any] = DomainDispatcherApplication.get_backend_for_host
    found: dict[str | None, Any] = {}
    lock = threading.Lock()

    def get_backend_for_host(self: Any, host: str | None) -> Any:
        with lock:
            if host not in found:
                found[host] = lookup(self, host)
            return found[host]

    DomainDispatcherApplication.get_backend_for_host = get_backend_for_host  # type: ignore[method-assign]


def _fast_sqs_clock() -> None:
    models: Any = importlib.import_module("moto.sqs.models")
    # Message.visible and .delayed read the clock through datetime arithmetic, once per message in the
    # queue for every receive and every attribute read; time.time() is the same clock, read cheaply.
    to_seconds = models.unix_time
    to_millis = models.unix_time_millis

    def unix_time(dt: Any = None) -> float:
        return time.time() if dt is None else float(to_seconds(dt))

    def unix_time_millis(dt: Any = None) -> float:
        return time.time() * 1000.0 if dt is None else float(to_millis(dt))

    models.unix_time = unix_time
    models.unix_time_millis = unix_time_millis


def _direct_sqs_retention_check() -> None:
    from moto.sqs.models import SQSBackend

    # moto computes every queue attribute (three scans of the queue) to read MessageRetentionPeriod,
    # once per received message: quadratic in the backlog just when a backlog needs draining.
    def is_message_valid_based_on_retention_period(self: Any, queue_name: str, message: Any) -> bool:
        retention_period = int(self.get_queue(queue_name).message_retention_period)
        return bool(retention_period + message.sent_timestamp / 1000 > time.time())

    SQSBackend.is_message_valid_based_on_retention_period = is_message_valid_based_on_retention_period  # type: ignore[method-assign]


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


class _NothingLeftToDrain:
    """The selector Werkzeug drains a request's unread body with, once the body was read whole: with
    the connection kept alive, what is readable is the client's next request, not leftovers."""

    def register(self, *_: Any) -> None:
        pass

    def select(self, timeout: float | None = None) -> list[Any]:
        return []

    def close(self) -> None:
        pass


def _keep_connections_alive() -> None:
    import io
    import selectors

    from moto import server
    from moto.moto_server.werkzeug_app import MotoRequestHandler
    from werkzeug import serving

    if "MotoRequestHandler" not in vars(server) or "selectors" not in vars(serving):
        raise AttributeError("moto.server or werkzeug.serving changed: connections are closed as before")
    body_read = threading.local()  # a connection is served by one thread: its current request's state

    class KeepAliveRequestHandler(MotoRequestHandler):
        """Keeps the connection open when the request body was read whole before the application ran
        (Werkzeug closes every connection, as it cannot know how much of the body was left unread)."""

        def setup(self) -> None:
            super().setup()
            # Werkzeug writes a response's headers and body separately: on a connection that stays
            # open, Nagle's algorithm would hold the body until the client's delayed ACK (~40 ms).
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def make_environ(self) -> dict[str, Any]:
            environ: dict[str, Any] = super().make_environ()
            length = str(environ.get("CONTENT_LENGTH", ""))
            body_read.whole = "wsgi.input_terminated" not in environ and (length == "" or length.isdigit())
            if body_read.whole:
                environ["wsgi.input"] = io.BytesIO(self.rfile.read(int(length or 0)))
            return environ

        def send_header(self, keyword: str, value: str) -> None:
            if (
                keyword.lower() == "connection"
                and value.lower() == "close"
                and getattr(body_read, "whole", False)
            ):
                return  # close_connection stays what the request asked for (HTTP/1.1: keep-alive)
            super().send_header(keyword, value)

    def default_selector() -> Any:
        return _NothingLeftToDrain() if getattr(body_read, "whole", False) else selectors.DefaultSelector()

    vars(serving)["selectors"] = types.SimpleNamespace(
        DefaultSelector=default_selector, EVENT_READ=selectors.EVENT_READ
    )
    vars(server)["MotoRequestHandler"] = KeepAliveRequestHandler


def _build_sns_certificate_once() -> None:
    import cryptography.x509
    from moto.sns import models

    if "cryptography" not in vars(models) or "get_post_data" not in vars(models.Subscription):
        raise AttributeError("moto.sns.models no longer builds certificates in get_post_data")
    built: dict[int, Any] = {}
    lock = threading.Lock()

    class CertificateBuilderOncePerKey:
        """What get_post_data calls as cryptography.x509.CertificateBuilder(): the same subject, issuer
        and key every time, so the first certificate built for a key is returned for the next ones."""

        def __init__(self) -> None:
            self._steps: list[tuple[str, tuple[Any, ...]]] = []

        def __getattr__(self, step: str) -> Callable[..., CertificateBuilderOncePerKey]:
            def record(*args: Any) -> CertificateBuilderOncePerKey:
                self._steps.append((step, args))
                return self

            return record

        def sign(self, key: Any, algorithm: Any) -> Any:
            with lock:
                if id(key) not in built:
                    builder = cryptography.x509.CertificateBuilder()
                    for step, args in self._steps:
                        builder = getattr(builder, step)(*args)
                    built[id(key)] = (key, builder.sign(key, algorithm))  # the key kept: its id stays its own
                return built[id(key)][1]

    class X509(types.SimpleNamespace):
        pass

    class Cryptography(types.SimpleNamespace):
        pass

    x509 = X509(
        **{
            name: getattr(cryptography.x509, name)
            for name in dir(cryptography.x509)
            if not name.startswith("__")
        }
    )
    x509.CertificateBuilder = CertificateBuilderOncePerKey
    x509.random_serial_number = lambda: 1  # the serial number of a certificate that is not built again
    vars(models)["cryptography"] = Cryptography(x509=x509)


def _quiet_access_log() -> None:
    logging.getLogger("werkzeug").setLevel(logging.WARNING)


SPEED_UPS: tuple[Callable[[], None], ...] = (
    _cache_jsonpath_parsing,
    _cache_backend_lookup,
    _fast_sqs_clock,
    _direct_sqs_retention_check,
    _quiet_access_log,
    _keep_connections_alive,
    _build_sns_certificate_once,
)


def apply_speed_ups() -> list[str]:
    """Apply each speed-up the installed moto allows; returns the names of those skipped."""
    skipped = []
    for speed_up in SPEED_UPS:
        try:
            speed_up()
        except (ImportError, AttributeError, TypeError) as exc:
            skipped.append(f"{speed_up.__name__}: {exc!r}")
    return skipped


# Corrections, not speed-ups: without them the server loses messages, so they are never skipped.
FIXES: tuple[Callable[[], None], ...] = (serialise_sqs_deletes,)


def main(argv: list[str]) -> None:
    for fix in FIXES:
        fix()
    for reason in apply_speed_ups():
        print(f"tools.local.services.moto_server: speed-up skipped ({reason})", file=sys.stderr, flush=True)
    from moto import server

    server.main(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
