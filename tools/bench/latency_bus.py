"""A stand-in for EventBridge at AWS's latency: an HTTP server, in a process of its own, that answers each
PutEvents after a set latency, accepts every entry, and records what it received (`make bench`'s relays at
AWS latency, tools/bench/relay_latency.py).

Why a process of its own: on AWS the bus is not inside the Lambda function, and the bench charges the
relay with what its process does while it drains. Run as threads of the bench's process, the server's own
work (reading each request, decoding every entry's Detail, recording it, answering) would hold the same
interpreter's lock as the relay under test and be counted in the relay's events/s. `LatencyBus` starts it
as a child process (`python -m tools.bench.latency_bus`, which prints its endpoint on its stdout's first
line), and reaches its latency and records through a control API on the same server.

PutEvents. It speaks PutEvents in the AWS JSON 1.1 protocol as far as botocore needs: a POST whose
`X-Amz-Target` is `AWSEvents.PutEvents` and whose body is `{"Entries": [...]}`, answered 200 with
`{"FailedEntryCount": 0, "Entries": [{"EventId": ...}, ...]}` (content type
`application/x-amz-json-1.1`); any other target is answered 400 `UnknownOperationException`. The product
reaches it through its normal boto3 client: `AWS_ENDPOINT_URL_EVENTBRIDGE` (botocore reads
`AWS_ENDPOINT_URL_<service id>`, and EventBridge's id is "EventBridge") pointing at `endpoint`.

Control API, JSON in and out (`application/json`), on paths under `/_control/`:
- `POST /_control/latency` with `{"latency_seconds": 0.05}`: the latency of the calls arriving from then on;
- `POST /_control/reset`: what was received forgotten;
- `GET /_control/figures`: `figures()`, counted in the bus's process;
- `GET /_control/calls`: every call received, its entries and their Details (the tests read them).
A request is a control request by its path alone and a PutEvents by its `X-Amz-Target` alone: botocore
sends every JSON 1.1 operation to the endpoint's path (`/`), never under `/_control/`, and a request on a
control path that carries an `X-Amz-Target` is refused (400) and changes nothing, so neither is ever taken
for the other.

The child dies with its parent: `stop()` (the end of `with LatencyBus() as bus:`) closes its stdin and
terminates it; and should the bench's process die without stopping it (killed), the child sees its stdin
end (the pipe's one writer, the parent, is gone) or its parent's pid change (it was reparented) within
PARENT_POLL_SECONDS, and shuts down.

Concurrent calls are answered concurrently: the server is the standard library's
`http.server.ThreadingHTTPServer` (checked in CPython 3.13's Lib/http/server.py and Lib/socketserver.py:
`ThreadingMixIn` with `daemon_threads = True`, one thread per connection), speaking HTTP/1.1 so botocore
keeps its pooled connections open (each call then costs the latency, not a TCP handshake), with Nagle's
algorithm off on its sockets (a response's headers and body otherwise wait on the client's delayed ACK)
and `block_on_close = False` (3.13's ThreadingMixIn otherwise joins every connection's thread on close,
and a pooled connection's thread waits for its next request until the client goes away).

What it records, per call: when it arrived and when it was answered (the monotonic clock of the bus's
process) and each entry's Detail. A Detail that is a CloudEvents envelope (shop/domain/envelope.py) names
its order, `subject`, and the order's `sequence` (the aggregate's version after the change), from which
`figures()` counts:
- `out_of_order`: entries whose sequence is lower than one already received for their order, in the
  order calls arrived (entries of one call in their order in the call);
- `in_flight_twice`: entries that arrived while an earlier call holding an event of the same order was
  still unanswered (what the relays promise never to do: an order's events are never in flight twice).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import http.client
import json
import math
import os
import select
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

PUT_EVENTS_TARGET = "AWSEvents.PutEvents"
CONTENT_TYPE = "application/x-amz-json-1.1"
CONTROL_CONTENT_TYPE = "application/json"
LOOPBACK = "127.0.0.1"
CONTROL_PREFIX = "/_control/"
LATENCY_PATH = CONTROL_PREFIX + "latency"
RESET_PATH = CONTROL_PREFIX + "reset"
FIGURES_PATH = CONTROL_PREFIX + "figures"
CALLS_PATH = CONTROL_PREFIX + "calls"
MODULE = "tools.bench.latency_bus"
ROOT = Path(__file__).resolve().parents[2]  # the repository: `python -m tools.bench.latency_bus` runs there
START_TIMEOUT_SECONDS = 30.0  # for the child to print its endpoint (an interpreter's start on a busy machine)
STOP_TIMEOUT_SECONDS = 10.0
CONTROL_TIMEOUT_SECONDS = 60.0
PARENT_POLL_SECONDS = 0.5


@dataclass(frozen=True, slots=True)
class Entry:
    """One entry received: its order and per-order sequence when its Detail is an envelope."""

    detail: str
    order: str | None
    sequence: int | None
    event_id: str | None


@dataclass(slots=True)
class Call:
    """One PutEvents call: when it arrived and was answered, and its entries in their order."""

    index: int
    arrived: float
    entries: list[Entry]
    answered: float | None = None


def entry_of(raw: dict[str, Any]) -> Entry:
    """An entry as received: the envelope's subject and sequence, when the Detail has them."""
    detail = str(raw.get("Detail", ""))
    try:
        envelope = json.loads(detail)
    except ValueError:
        envelope = None
    if not isinstance(envelope, dict):
        return Entry(detail, None, None, None)
    subject, sequence, event_id = envelope.get("subject"), envelope.get("sequence"), envelope.get("id")
    return Entry(
        detail,
        subject if isinstance(subject, str) else None,
        sequence if isinstance(sequence, int) and not isinstance(sequence, bool) else None,
        event_id if isinstance(event_id, str) else None,
    )


def out_of_order(received: Iterable[tuple[str | None, int | None]]) -> int:
    """Entries (order, sequence), in the order received, whose sequence is lower than one already received
    for their order. Entries without an order or sequence count for nothing; a repeat is not lower."""
    highest: dict[str, int] = {}
    count = 0
    for order, sequence in received:
        if order is None or sequence is None:
            continue
        if sequence < highest.get(order, sequence):
            count += 1
        else:
            highest[order] = sequence
    return count


def in_flight_twice(calls: Iterable[Call]) -> int:
    """Entries that arrived while an earlier call with an entry of the same order was still unanswered."""
    count = 0
    unanswered: list[Call] = []  # earlier calls, those answered before the current one arrived dropped
    for call in sorted(calls, key=lambda call: (call.arrived, call.index)):
        unanswered = [c for c in unanswered if c.answered is None or c.answered > call.arrived]
        in_flight = {entry.order for earlier in unanswered for entry in earlier.entries}
        count += sum(1 for entry in call.entries if entry.order is not None and entry.order in in_flight)
        unanswered.append(call)
    return count


def peak_in_flight(calls: Iterable[Call]) -> int:
    """The most calls unanswered at one time."""
    edges = sorted(
        edge
        for call in calls
        for edge in ((call.arrived, 1), (call.answered if call.answered is not None else float("inf"), -1))
    )
    peak = current = 0
    for _, step in edges:  # an answer sorts before an arrival at the same instant (-1 < 1)
        current += step
        peak = max(peak, current)
    return peak


class Recorder:
    """The bus's state, in its process: the latency of the calls arriving and what was received."""

    def __init__(self, latency_seconds: float = 0.0) -> None:
        self.latency_seconds = latency_seconds
        self._calls: list[Call] = []
        self._lock = threading.Lock()

    def put_events(self, entries: list[Entry]) -> dict[str, Any]:
        """Record the call on arrival, answer after the latency: every entry accepted."""
        latency = self.latency_seconds
        with self._lock:
            call = Call(len(self._calls), time.monotonic(), entries)
            self._calls.append(call)
        time.sleep(latency)
        call.answered = time.monotonic()
        return {"FailedEntryCount": 0, "Entries": [{"EventId": str(uuid.uuid4())} for _ in entries]}

    def reset(self) -> None:
        with self._lock:
            self._calls = []

    def calls(self) -> list[Call]:
        """The calls received so far, in the order they arrived."""
        with self._lock:
            return list(self._calls)

    def figures(self) -> dict[str, Any]:
        """What was received: calls, entries, distinct events, out of order, in flight twice, peak calls in
        flight."""
        calls = self.calls()
        entries = [entry for call in calls for entry in call.entries]
        return {
            "calls": len(calls),
            "entries": len(entries),
            "distinct_events": len({entry.event_id or entry.detail for entry in entries}),
            "out_of_order": out_of_order((entry.order, entry.sequence) for entry in entries),
            "in_flight_twice": in_flight_twice(calls),
            "peak_calls_in_flight": peak_in_flight(calls),
        }


def call_document(call: Call) -> dict[str, Any]:
    """A call as `GET /_control/calls` sends it."""
    return dataclasses.asdict(call)


def call_of(document: dict[str, Any]) -> Call:
    """A call as `GET /_control/calls` sent it."""
    entries = [Entry(**entry) for entry in document["entries"]]
    return Call(document["index"], document["arrived"], entries, document["answered"])


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 128  # listen backlog: many pooled connections may open at once

    def __init__(self, address: tuple[str, int], recorder: Recorder) -> None:
        super().__init__(address, _Handler)
        self.recorder = recorder

    @property
    def endpoint(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: botocore reuses its pooled connections
    disable_nagle_algorithm = True
    timeout = 60  # an idle pooled connection's thread ends after this
    server: _Server

    def do_POST(self) -> None:
        body = self._body()
        if self.path.startswith(CONTROL_PREFIX):
            self._control("POST", body)
        else:
            self._put_events(body)

    def do_GET(self) -> None:
        body = self._body()
        if self.path.startswith(CONTROL_PREFIX):
            self._control("GET", body)
        else:
            self._answer(404, {"error": f"no GET {self.path}: PutEvents is a POST"}, CONTROL_CONTENT_TYPE)

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _put_events(self, body: bytes) -> None:
        target = self.headers.get("X-Amz-Target", "")
        if target != PUT_EVENTS_TARGET:
            self._answer(400, {"__type": "UnknownOperationException", "message": f"not emulated: {target}"})
            return
        try:
            request = json.loads(body)
            entries = [entry_of(raw) for raw in request["Entries"]]
        except (ValueError, KeyError, TypeError, AttributeError):
            self._answer(400, {"__type": "ValidationException", "message": "unreadable PutEvents request"})
            return
        self._answer(200, self.server.recorder.put_events(entries))

    def _control(self, method: str, body: bytes) -> None:
        recorder = self.server.recorder
        if self.headers.get("X-Amz-Target") is not None:
            self._control_answer(400, {"error": f"{self.path} is a control path: no X-Amz-Target here"})
        elif (method, self.path) == ("GET", FIGURES_PATH):
            self._control_answer(200, recorder.figures())
        elif (method, self.path) == ("GET", CALLS_PATH):
            self._control_answer(200, {"calls": [call_document(call) for call in recorder.calls()]})
        elif (method, self.path) == ("POST", RESET_PATH):
            recorder.reset()
            self._control_answer(200, {})
        elif (method, self.path) == ("POST", LATENCY_PATH):
            try:
                seconds = float(json.loads(body)["latency_seconds"])
            except (ValueError, KeyError, TypeError):
                seconds = math.nan
            if not (math.isfinite(seconds) and seconds >= 0):
                self._control_answer(400, {"error": 'expected {"latency_seconds": <seconds, 0 or more>}'})
                return
            recorder.latency_seconds = seconds
            self._control_answer(200, {"latency_seconds": seconds})
        else:
            self._control_answer(404, {"error": f"no control {method} {self.path}"})

    def _control_answer(self, status: int, document: dict[str, Any]) -> None:
        self._answer(status, document, CONTROL_CONTENT_TYPE)

    def _answer(self, status: int, document: dict[str, Any], content_type: str = CONTENT_TYPE) -> None:
        payload = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("x-amzn-RequestId", str(uuid.uuid4()))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: thousands of calls a run."""


def parent_gone(parent_pid: int) -> bool:
    """Whether the process that started this one is gone: a child outliving its parent is reparented."""
    return os.getppid() != parent_pid


def _watch_parent(server: _Server, parent_pid: int) -> None:
    """Shut the server down once stdin ends (the parent closed it or died) or the parent is gone."""
    stdin = sys.stdin.fileno()
    while True:
        readable, _, _ = select.select([stdin], [], [], PARENT_POLL_SECONDS)
        if readable and not os.read(stdin, 4096):
            break
        if parent_gone(parent_pid):
            break
    server.shutdown()


def serve(host: str, port: int, latency_seconds: float, parent_pid: int) -> None:
    """The bus's process: its endpoint printed on stdout's first line, then served until stdin ends or the
    parent is gone."""
    server = _Server((host, port), Recorder(latency_seconds))
    try:
        threading.Thread(
            target=_watch_parent, args=(server, parent_pid), name="parent-watch", daemon=True
        ).start()
        print(server.endpoint, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            server.serve_forever(poll_interval=0.05)
    finally:
        server.server_close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog=f"python -m {MODULE}",
        description="EventBridge's PutEvents answered after a latency; serves until stdin ends.",
    )
    parser.add_argument("--host", default=LOOPBACK)
    parser.add_argument("--port", type=int, default=0, help="0 (the default): any free port")
    parser.add_argument("--latency-seconds", type=float, default=0.0)
    parser.add_argument("--parent-pid", type=int, default=os.getppid(), help="stop once it is gone")
    arguments = parser.parse_args(argv)
    serve(arguments.host, arguments.port, arguments.latency_seconds, arguments.parent_pid)


class LatencyBus:
    """The bus as the bench sees it: `with LatencyBus(0.05) as bus:` runs the bus's process and serves
    `bus.endpoint` until the block ends; `latency_seconds` may change between runs, `reset()` forgets what
    was received, `figures()` counts it (each a control call to the bus's process)."""

    def __init__(self, latency_seconds: float = 0.0, host: str = LOOPBACK, port: int = 0) -> None:
        self._latency_seconds = latency_seconds
        self._host = host
        self._port = port
        self._process: subprocess.Popen[bytes] | None = None
        self._endpoint: str | None = None

    @property
    def endpoint(self) -> str:
        if self._endpoint is None:
            raise RuntimeError("the latency bus is not serving: start() it, or `with LatencyBus() as bus:`")
        return self._endpoint

    @property
    def pid(self) -> int | None:
        """The bus's process id while it serves."""
        return None if self._process is None else self._process.pid

    @property
    def latency_seconds(self) -> float:
        return self._latency_seconds

    @latency_seconds.setter
    def latency_seconds(self, seconds: float) -> None:
        """The latency of the calls arriving from now on (told to the bus's process when it serves)."""
        if self._process is not None:
            self._control("POST", LATENCY_PATH, {"latency_seconds": seconds})
        self._latency_seconds = seconds

    def start(self) -> LatencyBus:
        if self._process is not None:
            raise RuntimeError("the latency bus is serving already")
        command = [sys.executable, "-m", MODULE, "--host", self._host, "--port", str(self._port)]
        command += ["--latency-seconds", repr(self._latency_seconds), "--parent-pid", str(os.getpid())]
        # stdin a pipe that only this process writes to: it ends when this process stops the bus or dies.
        # stderr this process's own (a failure to start reads there). The repository on the child's path
        # whatever this process's working directory.
        path = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": path},
        )
        try:
            self._endpoint = self._read_endpoint(self._process)
        except BaseException:
            self.stop()
            raise
        return self

    @staticmethod
    def _read_endpoint(process: subprocess.Popen[bytes]) -> str:
        assert process.stdout is not None
        readable, _, _ = select.select([process.stdout], [], [], START_TIMEOUT_SECONDS)
        line = process.stdout.readline().decode().strip() if readable else ""
        if not line.startswith("http://"):
            raise RuntimeError(
                f"the latency bus did not print its endpoint within {START_TIMEOUT_SECONDS:.0f} s "
                f"(exit status {process.poll()}, printed {line!r})"
            )
        return line

    def stop(self) -> None:
        """The bus's process ended: stdin closed, terminated, waited for (killed should it linger)."""
        process, self._process, self._endpoint = self._process, None, None
        if process is None:
            return
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        process.terminate()
        try:
            process.wait(STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def __enter__(self) -> LatencyBus:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _control(self, method: str, path: str, document: dict[str, Any] | None = None) -> dict[str, Any]:
        """One control call to the bus's process: its JSON answer (a failure raises)."""
        address = urlsplit(self.endpoint)
        connection = http.client.HTTPConnection(
            address.hostname or self._host, address.port, timeout=CONTROL_TIMEOUT_SECONDS
        )
        try:
            body = None if document is None else json.dumps(document).encode()
            headers = {} if body is None else {"Content-Type": CONTROL_CONTENT_TYPE}
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            payload = response.read()
        finally:
            connection.close()
        if response.status != 200:
            raise RuntimeError(f"the latency bus answered {method} {path} {response.status}: {payload!r}")
        answer: dict[str, Any] = json.loads(payload)
        return answer

    def reset(self) -> None:
        self._control("POST", RESET_PATH)

    def calls(self) -> list[Call]:
        """The calls received so far, in the order they arrived."""
        return [call_of(document) for document in self._control("GET", CALLS_PATH)["calls"]]

    def received(self) -> Iterator[Entry]:
        """Every entry received, in the order calls arrived (a call's entries in their order)."""
        for call in self.calls():
            yield from call.entries

    def figures(self) -> dict[str, Any]:
        """What was received: calls, entries, distinct events, out of order, in flight twice, peak calls in
        flight (counted by the bus's process: `Recorder.figures`)."""
        return self._control("GET", FIGURES_PATH)


if __name__ == "__main__":
    main()
