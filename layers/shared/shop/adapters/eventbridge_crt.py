"""PutEvents over the AWS Common Runtime (aws-crt-python): the PostgreSQL publisher's transport
(PUBLISH_TRANSPORT=crt in template.yaml), for the CPU a PutEvents call costs.

Why. botocore spends about 3 ms of CPU on a PutEvents call of ten entries (request building, event hooks,
parameter validation, signing, the user agent, urllib3): 0.3 ms an event, which alone holds a relay on one
vCPU near 3,000 events/s whatever else it does. awscrt signs (SigV4) and speaks HTTP in C: about 1 ms a
call, the event loop's thread included (docs/performance.md, "The PutEvents transport"). botocore uses
awscrt for signing when it is installed, but sends every request through its own Python pipeline; no
maintained library sends an AWS JSON request through awscrt's HTTP client (checked: botocore, aiobotocore,
awscrt's own samples, which cover S3 and MQTT only), so the request is written here.

The cost: loading awscrt's native library takes about 65 ms of CPU, once per execution environment, which
is why only a function that publishes through it imports this module (shop.adapters.aws.events_over_crt,
on first use), and why it is not in the shared layer: botocore imports awscrt whenever it can, so every
function would pay for it.

The contract is the SDK client's `put_events`, as EventPublisher (adapters.eventbridge) uses it, so the
publisher's retries, checkpoint and poison handling do not depend on the transport:
- endpoint, region, timeouts and credentials are the boto3 client's (AWS_ENDPOINT_URL_EVENTBRIDGE or
  AWS_ENDPOINT_URL; its session's credentials, the function role's, read at each call as botocore reads
  them, so refreshed when botocore would refresh them);
- a 2xx answer (EventBridge answers 200) is returned as its JSON (FailedEntryCount, and Entries
  with an EventId or an ErrorCode and ErrorMessage each), as botocore reads one;
- any other answer raises botocore's ClientError, its code and message read as botocore's JSON protocol
  parser reads them (BaseJSONParser._do_error_parse and the generic 5xx parse, botocore/parsers.py);
- a connection that cannot be made, fails, or does not answer within the read timeout, and any error
  awscrt raises (its errors map to AwsCrtError or to builtins such as MemoryError), raise a
  BotoCoreError: the call's outcome is unknown, the publisher retries it, consumers absorb a duplicate.
tests/conformance/test_put_events_transport.py holds each of these against the SDK client on the same
answers, and the signature against botocore's own SigV4 signer.
Not carried over from botocore: proxies and a custom CA bundle (the system trust store is used: Lambda
reaches EventBridge directly or through the VPC's interface endpoint), and the X-Amzn-Trace-Id header
(each entry's TraceHeader carries its event's trace).
"""

from __future__ import annotations

import collections
import hashlib
import http.client
import io
import json
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

import awscrt
from awscrt import auth
from awscrt import http as crt_http
from awscrt import io as crt_io
from botocore.credentials import Credentials
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    HTTPClientError,
    NoCredentialsError,
    ReadTimeoutError,
)

from shop.adapters import aws

if TYPE_CHECKING:
    from shop.adapters.eventbridge import Answer  # the publisher's PutEventsCalls contract

_TARGET = "AWSEvents.PutEvents"
_CONTENT_TYPE = "application/x-amz-json-1.1"  # EventBridge speaks the AWS JSON 1.1 protocol
_USER_AGENT = f"shop-outbox-publisher awscrt/{awscrt.__version__}"


class CrtPutEvents:
    """PutEvents calls to one endpoint: begun from any thread and answered on awscrt's event loop thread
    (`begin`: adapters.eventbridge's PutEventsCalls), or one call waited for (`put_events`, the SDK
    client's contract).

    Why callbacks and not a thread per call in flight: a call the publisher waits for on a worker thread
    costs two more thread wake-ups and handoffs of the interpreter's lock, which at 32 calls in flight
    made up about a third of a call's CPU (docs/performance.md, "The PutEvents transport"). Here the
    publishing thread signs each call and sends it on an idle connection (on a new one, awscrt's event
    loop thread sends it once connected), and the event loop thread reads the answer and hands it over.

    Connections: HTTP/1.1 carries one call at a time, so each call takes an idle open connection or opens
    one, and gives it back once answered. A connection that failed, or whose call timed out once sent, is
    closed, never reused; one that opened after its call timed out connecting is unused, and pooled."""

    def __init__(self, sdk_client: Any, credentials: Credentials | None) -> None:
        """`sdk_client`: the boto3 EventBridge client whose endpoint, region and timeouts it takes;
        `credentials`: those of the session the client was made from (None: none found)."""
        url = urlsplit(sdk_client.meta.endpoint_url)
        self.endpoint_url = sdk_client.meta.endpoint_url
        self._host = url.hostname or ""
        self._secure = url.scheme == "https"
        self._port = url.port or (443 if self._secure else 80)
        # As http.client writes it: the port only when it is not the scheme's, no user information.
        host = f"[{self._host}]" if ":" in self._host else self._host
        self._host_header = host if url.port in (None, 443 if self._secure else 80) else f"{host}:{url.port}"
        self._path = url.path or "/"
        config = sdk_client.meta.config
        self._connect_timeout = float(config.connect_timeout)
        self._read_timeout = float(config.read_timeout)
        self._credentials = credentials
        self._region = sdk_client.meta.region_name
        event_loops = crt_io.EventLoopGroup(1)
        self._bootstrap = crt_io.ClientBootstrap(event_loops, crt_io.DefaultHostResolver(event_loops))
        self._socket = crt_io.SocketOptions()
        self._socket.connect_timeout_ms = int(self._connect_timeout * 1000)
        self._tls = crt_io.ClientTlsContext(crt_io.TlsContextOptions()) if self._secure else None
        self._idle: collections.deque[crt_http.HttpClientConnection] = collections.deque()
        self._lock = threading.Lock()
        self._calls: set[_Call] = set()  # begun and not yet answered, for expire_overdue

    def put_events(self, *, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        """One call, waited for: its result, or the error the SDK client would raise."""
        answered: queue.SimpleQueue[Answer] = queue.SimpleQueue()
        self._start(Entries, answered.put)
        while True:
            try:
                outcome = answered.get(timeout=self.expire_overdue())
            except queue.Empty:
                continue
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome

    def begin(self, entries: list[dict[str, Any]], answer: Callable[[Answer], None]) -> None:
        """Send one call now; `answer` is called once with its result or the error the SDK client would
        raise: from this thread (a failure before sending), awscrt's event loop thread (the endpoint's
        answer, or a failed connection), or the thread calling expire_overdue (a timeout: a call not
        answered in time is answered so when expire_overdue() is next called; call it at the latest when
        it said to)."""
        self._start(entries, answer)

    # put_events and begin both send through _start, so that a wrapper of either (the chaos injector's,
    # tools/chaos/injection.py) sees each call once.
    def _start(self, entries: list[dict[str, Any]], answer: Callable[[Answer], None]) -> None:
        body = json.dumps({"Entries": entries}).encode()
        try:
            signed = self._signed_request(body)
        except (BotoCoreError, ClientError) as exc:  # the credentials' refresh, raised as the SDK raises it
            answer(exc)
            return
        except Exception as exc:  # noqa: BLE001 -- awscrt's errors, whatever their class: nothing was sent
            answer(HTTPClientError(error=exc))
            return
        # awscrt times the connect itself; past its timeout by the grace, the call is answered whatever it did
        call = _Call(answer, time.monotonic() + self._connect_timeout + aws.CRT_CONNECT_GRACE_SECONDS)
        with self._lock:
            self._calls.add(call)
        while self._idle:
            try:
                connection = self._idle.pop()
            except IndexError:  # another thread took the last one
                break
            if connection.is_open():
                self._send(call, connection, signed)
                return
        try:
            tls = None
            if self._tls is not None:
                tls = self._tls.new_connection_options()
                tls.set_server_name(self._host)
            opening = crt_http.HttpClientConnection.new(
                host_name=self._host,
                port=self._port,
                bootstrap=self._bootstrap,
                socket_options=self._socket,
                tls_connection_options=tls,
            )
        except Exception:  # noqa: BLE001 -- awscrt's errors, whatever their class
            self._finish(call, EndpointConnectionError(endpoint_url=self.endpoint_url))
            return
        opening.add_done_callback(lambda opened: self._opened(call, opened, signed))

    def expire_overdue(self) -> float | None:
        """Answer every call past its deadline with the SDK's timeout error (its connection closed: a late
        answer must not be read as another call's); the seconds until the next deadline, None when no
        call is waiting."""
        now = time.monotonic()
        with self._lock:
            calls = list(self._calls)
        looks = []
        for call in calls:
            expired, connection = call.expire(now)
            if not expired:
                look = call.next_look(now, self._read_timeout)
                if look is not None:
                    looks.append(look)
                continue
            self._forget(call)
            if connection is None:
                call.answer(ConnectTimeoutError(endpoint_url=self.endpoint_url))
            else:
                connection.close()
                call.answer(ReadTimeoutError(endpoint_url=self.endpoint_url))
        return min(looks) - now if looks else None

    def _signed_request(self, body: bytes) -> crt_http.HttpRequest:
        """The PutEvents request for `body`, signed (SigV4) with the credentials botocore holds now."""
        request = crt_http.HttpRequest(
            "POST",
            self._path,
            crt_http.HttpHeaders(
                [
                    ("Host", self._host_header),
                    ("Content-Type", _CONTENT_TYPE),
                    ("X-Amz-Target", _TARGET),
                    ("Content-Length", str(len(body))),
                    ("User-Agent", _USER_AGENT),
                ]
            ),
            io.BytesIO(body),
        )
        signed: crt_http.HttpRequest = auth.aws_sign_request(request, self._signing(body)).result()
        return signed

    def _signing(self, body: bytes) -> auth.AwsSigningConfig:
        """SigV4 for this call, with the credentials botocore holds now (refreshed, or its error raised,
        here: in awscrt's callback a Python error would only be printed). The payload's hash is given, as
        SigV4 hashes it (hex SHA-256 of the body): awscrt would otherwise read the body back through its
        Python stream wrapper, under the interpreter lock, to hash it."""
        if self._credentials is None:
            raise NoCredentialsError()
        frozen = self._credentials.get_frozen_credentials()
        return auth.AwsSigningConfig(
            algorithm=auth.AwsSigningAlgorithm.V4,
            signature_type=auth.AwsSignatureType.HTTP_REQUEST_HEADERS,
            credentials_provider=auth.AwsCredentialsProvider.new_static(
                frozen.access_key, frozen.secret_key, frozen.token
            ),
            region=self._region,
            service="events",
            signed_body_value=hashlib.sha256(body).hexdigest(),
        )

    def _opened(self, call: _Call, opened: Future[crt_http.HttpClientConnection], signed: Any) -> None:
        """On the event loop thread: the connection for `call` is open, or could not be."""
        try:
            connection = opened.result()
        except Exception as exc:  # noqa: BLE001 -- awscrt's errors, whatever their class
            error: BotoCoreError = (
                ConnectTimeoutError(endpoint_url=self.endpoint_url)
                if getattr(exc, "name", "") == "AWS_IO_SOCKET_TIMEOUT"
                else EndpointConnectionError(endpoint_url=self.endpoint_url)
            )
            self._finish(call, error)
            return
        self._send(call, connection, signed)

    def _send(self, call: _Call, connection: crt_http.HttpClientConnection, signed: Any) -> None:
        if not call.attach(connection, time.monotonic() + self._read_timeout):
            self._idle.append(connection)  # the call timed out while connecting: unused, good for the next
            return
        try:
            stream = connection.request(signed, on_response=call.on_response, on_body=call.on_body)
            stream.completion_future.add_done_callback(lambda done: self._completed(call, connection, done))
            stream.activate()
        except Exception as exc:  # noqa: BLE001 -- awscrt's errors, whatever their class
            connection.close()
            self._finish(call, HTTPClientError(error=exc))

    def _completed(self, call: _Call, connection: crt_http.HttpClientConnection, done: Future[Any]) -> None:
        """On the event loop thread: the call's stream ended. Nothing raised here may escape: awscrt
        would only print it, and the call would wait for its deadline."""
        try:
            done.result()
            outcome = call.outcome()
        except Exception as exc:  # noqa: BLE001 -- awscrt's, whatever their class (a callback's too)
            connection.close()
            self._finish(call, HTTPClientError(error=exc))
        else:
            self._finish(call, outcome, reusable=connection)

    def _finish(
        self, call: _Call, outcome: Answer, reusable: crt_http.HttpClientConnection | None = None
    ) -> None:
        """Answer `call` unless a timeout answered it first: forgotten, its connection (`reusable`, once
        answered in full) back in the pool, then its caller answered, so that a call its caller begins
        at once finds that connection."""
        if not call.claim():
            return
        self._forget(call)
        if reusable is not None and reusable.is_open():
            self._idle.append(reusable)
        call.answer(outcome)

    def _forget(self, call: _Call) -> None:
        with self._lock:
            self._calls.discard(call)


class _Call:
    """One call in flight: what was answered so far, and whether its caller has been answered."""

    __slots__ = ("_answer", "_lock", "answered", "chunks", "connection", "deadline", "headers", "status")

    def __init__(self, answer: Callable[[Answer], None], deadline: float) -> None:
        self._answer = answer
        self._lock = threading.Lock()
        self.answered = False
        self.deadline = deadline
        self.connection: crt_http.HttpClientConnection | None = None
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.chunks: list[bytes] = []

    # awscrt calls back with keyword arguments: the parameters keep its names.
    def on_response(self, status_code: int, headers: list[tuple[str, str]], **_: Any) -> None:
        self.status = status_code
        self.headers.update((name.lower(), value) for name, value in headers)

    def on_body(self, chunk: bytes, **_: Any) -> None:
        self.chunks.append(bytes(chunk))

    def outcome(self) -> Answer:
        """What the SDK client returns or raises for the answer received."""
        if self.status is None:
            return HTTPClientError(error=ValueError("the connection ended without an answer"))
        answer = b"".join(self.chunks)
        if 200 <= self.status < 300:  # what botocore returns as a result
            try:
                parsed = json.loads(answer)
            except ValueError:
                parsed = None
            if not isinstance(parsed, dict):  # a cut or foreign answer: whether the call landed is unknown
                return HTTPClientError(
                    error=ValueError(f"PutEvents answer is not a JSON object: {answer[:200]!r}")
                )
            return parsed
        return ClientError(cast("Any", error_response(self.status, self.headers, answer)), "PutEvents")

    def claim(self) -> bool:
        """Take the right to answer the caller, once: False when it was taken already."""
        with self._lock:
            if self.answered:
                return False
            self.answered = True
            return True

    def answer(self, outcome: Answer) -> None:
        """Answer the caller (after claim() or expire() gave the right to)."""
        self._answer(outcome)

    def attach(self, connection: crt_http.HttpClientConnection, deadline: float) -> bool:
        """The connection the call is about to be sent on, and its read deadline: False (not to be sent)
        when the call was answered already."""
        with self._lock:
            if self.answered:
                return False
            self.connection = connection
            self.deadline = deadline
            return True

    def expire(self, now: float) -> tuple[bool, crt_http.HttpClientConnection | None]:
        """Whether the call was unanswered and past its deadline at `now` (then its caller is the expirer's
        to answer), and the connection it was sent on (None: it was still connecting)."""
        with self._lock:
            if self.answered or self.deadline > now:
                return False, None
            self.answered = True
            return True, self.connection

    def next_look(self, now: float, read_timeout: float) -> float | None:
        """When to look at the call again: its deadline; for a call still connecting, no later than
        read_timeout from now (sent meanwhile, it has a read deadline no earlier than that)."""
        with self._lock:
            if self.answered:
                return None
            return self.deadline if self.connection else min(self.deadline, now + read_timeout)


def error_response(status: int, headers: dict[str, str], body: bytes) -> dict[str, Any]:
    """The ClientError response botocore builds from an error answer of the JSON 1.1 protocol."""
    metadata: dict[str, Any] = {"HTTPStatusCode": status, "HTTPHeaders": headers}
    if "x-amzn-requestid" in headers:
        metadata["RequestId"] = headers["x-amzn-requestid"]
    stripped = body.strip()
    if status >= 500 and (not stripped or stripped.startswith(b"<html>")):
        # botocore's generic parse: a 5xx whose body is empty or a page (a proxy's, a load balancer's)
        error = {"Code": str(status), "Message": http.client.responses.get(status, "")}
        return {"Error": error, "ResponseMetadata": metadata}
    try:
        document = json.loads(body) if body else {}
    except ValueError:
        document = {"message": body.decode("utf-8", "replace")}
    if not isinstance(document, dict):
        document = {}
    code = str(document.get("__type", str(status))).split(":", 1)[0].rsplit("#", 1)[-1]
    error = {"Code": code, "Message": document.get("message", document.get("Message", ""))}
    return {"Error": error, "ResponseMetadata": metadata}
