"""moto server with its per-request hot spots cached: same behaviour, a fraction of the CPU under load.

Started by local.services as `python -m local.moto_server -H 127.0.0.1 -p PORT` (the arguments of
`python -m moto.server`). Profiled under the local stack's load (py-spy), moto spends most of its time
on work that gives the same answer every time:
- EventBridge: for every target of every matching event, moto builds a new JSONPath parser (PLY
  grammar tables included) to read the target's input paths; the parsed expressions are cached here.
- Request routing: every request lists moto's package directory and tries hundreds of URL patterns,
  under a lock that serialises the server's threads; the answer per host is cached here.
- Werkzeug writes an access-log line per request; only warnings and errors are logged here.
Each change is skipped (and said so in the log) when the installed moto no longer has the hook, so a
moto upgrade can make the server slower, never wrong.
"""

from __future__ import annotations

import functools
import importlib
import logging
import sys
import threading
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


def _quiet_access_log() -> None:
    logging.getLogger("werkzeug").setLevel(logging.WARNING)


SPEED_UPS: tuple[Callable[[], None], ...] = (
    _cache_jsonpath_parsing,
    _cache_backend_lookup,
    _quiet_access_log,
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


def main(argv: list[str]) -> None:
    for reason in apply_speed_ups():
        print(f"local.moto_server: speed-up skipped ({reason})", file=sys.stderr, flush=True)
    from moto import server

    server.main(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
