"""The PostgreSQL publisher's PutEvents transport (shop.adapters.eventbridge_crt, awscrt) against the SDK,
the oracle it must match: on the same answers of a scripted endpoint it returns what the boto3 client
returns and raises what it raises; its SigV4 signature is the one botocore's own signer computes for the
request it sent; and on the local stack's bus its events arrive as the SDK's do."""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

import boto3
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import BotoCoreError, ClientError, CredentialRetrievalError, ReadTimeoutError

from shop.adapters import aws
from shop.adapters.eventbridge import EventPublisher
from shop.adapters.eventbridge_crt import CrtPutEvents, _Call
from tests.support.outbox_entries import order_entry
from tools.local.services.emulators import LocalServices

ENTRIES: list[dict[str, Any]] = [
    {"EventBusName": "orders", "Source": "shop.orders", "DetailType": "OrderCreated", "Detail": '{"n": 1}'},
    {"EventBusName": "orders", "Source": "shop.orders", "DetailType": "OrderConfirmed", "Detail": '{"é": 2}'},
]
ENVIRONMENT = {
    "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
    "AWS_SECRET_ACCESS_KEY": "secret",
    "AWS_SESSION_TOKEN": "token",
    "AWS_DEFAULT_REGION": "eu-west-1",
}


class Scripted(ThreadingHTTPServer):
    """Answers each request with `answer` (status, headers, body) after `delay` seconds, or, when `reply` is
    set, with what it returns for the request's body (delay, answer); keeps what it got."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = 64  # socketserver's 5 drops connections opened together: a 1 s SYN retry each

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answer: tuple[int, dict[str, str], bytes] = (200, {}, b"{}")
        self.delay = 0.0
        self.reply: Callable[[bytes], tuple[float, tuple[int, dict[str, str], bytes]]] | None = None
        self.received: list[tuple[dict[str, str], bytes]] = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet: a late answer's write fails when the client timed out and closed the connection."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Scripted

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.received.append(({name.lower(): value for name, value in self.headers.items()}, body))
        delay, (status, headers, answer) = (
            (self.server.delay, self.server.answer) if self.server.reply is None else self.server.reply(body)
        )
        time.sleep(delay)
        self.send_response(status)
        for name, value in {"Content-Type": "application/x-amz-json-1.1", **headers}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)
        self.close_connection = headers.get("Connection") == "close"

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def session_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """A function role's session credentials and region, as Lambda sets them."""
    for name, value in ENVIRONMENT.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def endpoint(session_credentials: None) -> Iterator[Scripted]:
    server = Scripted()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def clients(server: Scripted, read_timeout: float = 5) -> tuple[Any, CrtPutEvents]:
    """The SDK client as shop.adapters.aws configures it (no SDK retries), and the transport built on it
    with its session's credentials."""
    config = Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=read_timeout)
    session = boto3.session.Session()
    sdk = session.client("events", endpoint_url=server.endpoint, config=config)
    return sdk, CrtPutEvents(sdk, session.get_credentials())


def test_an_accepted_call_and_a_partial_failure_return_what_the_sdk_returns(endpoint: Scripted) -> None:
    sdk, crt = clients(endpoint)
    answer = {
        "FailedEntryCount": 1,
        "Entries": [
            {"EventId": "11710aed-b79e-4468-a20b-bb3c0c3b4860"},
            {"ErrorCode": "ThrottlingException", "ErrorMessage": "Rate exceeded"},
        ],
    }
    endpoint.answer = (200, {}, json.dumps(answer).encode())
    from_sdk = sdk.put_events(Entries=ENTRIES)
    from_crt = crt.put_events(Entries=ENTRIES)
    assert from_crt["FailedEntryCount"] == from_sdk["FailedEntryCount"] == 1
    assert from_crt["Entries"] == from_sdk["Entries"]
    # The same request reached the endpoint: the AWS JSON 1.1 operation and the same entries.
    (sdk_headers, sdk_body), (crt_headers, crt_body) = endpoint.received
    assert crt_headers["x-amz-target"] == sdk_headers["x-amz-target"] == "AWSEvents.PutEvents"
    assert crt_headers["content-type"] == sdk_headers["content-type"]
    assert crt_headers["x-amz-security-token"] == sdk_headers["x-amz-security-token"] == "token"
    assert json.loads(crt_body) == json.loads(sdk_body) == {"Entries": ENTRIES}


@pytest.mark.parametrize(
    ("status", "headers", "body"),
    [
        (
            400,
            {"x-amzn-RequestId": "r-1"},
            b'{"__type": "com.amazonaws.events#ValidationException", "message": "bad"}',
        ),
        (400, {}, b'{"__type": "AccessDeniedException", "Message": "not allowed"}'),
        (400, {}, b'{"__type": "ThrottlingException:http://internal.amazon.com/", "message": "slow down"}'),
        (404, {}, b'{"__type": "ResourceNotFoundException", "message": "Event bus orders does not exist."}'),
        (400, {}, b"not json at all"),
        (500, {}, b'{"__type": "InternalException", "message": "oops"}'),
        (500, {}, b""),
        (503, {}, b"<html><body>Service Unavailable</body></html>"),
    ],
)
def test_an_error_answer_raises_the_client_error_the_sdk_raises(
    endpoint: Scripted, status: int, headers: dict[str, str], body: bytes
) -> None:
    sdk, crt = clients(endpoint)
    endpoint.answer = (status, headers, body)
    with pytest.raises(ClientError) as from_sdk:
        sdk.put_events(Entries=ENTRIES)
    with pytest.raises(ClientError) as from_crt:
        crt.put_events(Entries=ENTRIES)
    assert from_crt.value.response["Error"] == from_sdk.value.response["Error"]
    sdk_meta, crt_meta = (
        from_sdk.value.response["ResponseMetadata"],
        from_crt.value.response["ResponseMetadata"],
    )
    assert crt_meta["HTTPStatusCode"] == sdk_meta["HTTPStatusCode"] == status
    assert crt_meta.get("RequestId") == sdk_meta.get("RequestId")
    assert from_crt.value.operation_name == "PutEvents"


ACCEPTED = b'{"FailedEntryCount": 0, "Entries": [{"EventId": "a"}, {"EventId": "b"}]}'


def test_any_2xx_answer_is_a_result_as_botocore_reads_it(endpoint: Scripted) -> None:
    sdk, crt = clients(endpoint)
    endpoint.answer = (202, {}, ACCEPTED)
    assert crt.put_events(Entries=ENTRIES)["Entries"] == sdk.put_events(Entries=ENTRIES)["Entries"]


def test_a_connection_the_endpoint_closes_after_its_answer_is_not_reused(endpoint: Scripted) -> None:
    _, crt = clients(endpoint)
    endpoint.answer = (200, {"Connection": "close"}, ACCEPTED)
    for _ in range(3):  # each call after the first would fail on the closed connection
        assert crt.put_events(Entries=ENTRIES)["FailedEntryCount"] == 0
    assert len(endpoint.received) == 3


def test_an_answer_later_than_the_read_timeout_is_a_botocore_error_and_the_next_call_is_not_misread(
    endpoint: Scripted,
) -> None:
    _, crt = clients(endpoint, read_timeout=0.3)
    endpoint.delay = 1.0
    endpoint.answer = (
        200,
        {},
        b'{"FailedEntryCount": 0, "Entries": [{"EventId": "late"}, {"EventId": "late"}]}',
    )
    began = time.monotonic()
    with pytest.raises(BotoCoreError):
        crt.put_events(Entries=ENTRIES)
    assert time.monotonic() - began < 0.9
    endpoint.delay = 0.0
    endpoint.answer = (200, {}, b'{"FailedEntryCount": 0, "Entries": [{"EventId": "a"}, {"EventId": "b"}]}')
    assert [entry["EventId"] for entry in crt.put_events(Entries=ENTRIES)["Entries"]] == ["a", "b"]


def accepted_each(body: bytes) -> tuple[int, dict[str, str], bytes]:
    """PutEvents accepted, each entry's EventId its Detail: an answer names the call it answers."""
    entries = json.loads(body)["Entries"]
    answer = {"FailedEntryCount": 0, "Entries": [{"EventId": entry["Detail"]} for entry in entries]}
    return 200, {}, json.dumps(answer).encode()


def labelled(answers: queue.SimpleQueue[tuple[Any, Any]], label: Any) -> Callable[[Any], None]:
    """A call's `answer`: puts (label, answer) in `answers`."""
    return lambda answer: answers.put((label, answer))


def test_calls_begun_together_are_in_flight_together_and_each_gets_its_own_answer(endpoint: Scripted) -> None:
    _, crt = clients(endpoint)
    endpoint.reply = lambda body: (0.3, accepted_each(body))
    answers: queue.SimpleQueue[tuple[Any, Any]] = queue.SimpleQueue()
    began = time.monotonic()
    for call in range(8):
        crt.begin(
            [{**ENTRIES[0], "Detail": json.dumps({"call": call})}],
            labelled(answers, call),
        )
    answered = dict(answers.get(timeout=5) for _ in range(8))
    assert time.monotonic() - began < 1.2  # one after another, they would take 2.4 s
    assert {call: answer["Entries"][0]["EventId"] for call, answer in answered.items()} == {
        call: json.dumps({"call": call}) for call in range(8)
    }
    assert answers.empty()
    assert crt.expire_overdue() is None  # none left waiting


def test_a_call_past_its_read_timeout_is_answered_with_the_sdks_timeout_and_holds_no_other(
    endpoint: Scripted,
) -> None:
    _, crt = clients(endpoint, read_timeout=0.5)
    endpoint.reply = lambda body: (3.0 if b"slow" in body else 0.0, accepted_each(body))
    answers: queue.SimpleQueue[tuple[Any, Any]] = queue.SimpleQueue()
    began = time.monotonic()
    for name in ("slow", "quick"):
        crt.begin(
            [{**ENTRIES[0], "Detail": json.dumps(name)}],
            labelled(answers, name),
        )
    name, answer = answers.get(timeout=2)
    assert name == "quick"
    assert answer["FailedEntryCount"] == 0
    while (wait := crt.expire_overdue()) is not None:  # as the publisher does between answers
        assert wait <= 0.5
        time.sleep(wait)
    name, answer = answers.get_nowait()
    assert name == "slow"
    assert isinstance(answer, ReadTimeoutError)  # what botocore raises: the publisher retries it
    assert time.monotonic() - began < 2.0  # before the endpoint's answer, which is never read


def test_the_publisher_over_it_keeps_calls_in_flight_together_and_retries_one_that_timed_out_in_order(
    endpoint: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, crt = clients(endpoint, read_timeout=0.3)
    monkeypatch.setattr(aws, "events_over_crt", lambda: crt)
    slow_once = {"o03-1"}  # the first call carrying o03's first event outlasts the read timeout
    spans: list[tuple[float, float]] = []  # when each call arrived, and when it was answered

    def reply(body: bytes) -> tuple[float, tuple[int, dict[str, str], bytes]]:
        ids = [json.loads(entry["Detail"])["id"] for entry in json.loads(body)["Entries"]]
        delay = 1.0 if slow_once.intersection(ids) else 0.1
        slow_once.difference_update(ids)
        spans.append((time.monotonic(), time.monotonic() + delay))
        answer = {"FailedEntryCount": 0, "Entries": [{"EventId": event_id} for event_id in ids]}
        return delay, (200, {}, json.dumps(answer).encode())

    endpoint.reply = reply
    # 40 orders' first events fill four calls; o03's second waits for the call holding its first
    entries = [*(order_entry(f"o{order:02d}", 1) for order in range(40)), order_entry("o03", 2)]
    publisher = EventPublisher("orders", 262_144, max_in_flight=8, transport="crt")

    began = time.monotonic()
    result = publisher.publish_in_order(entries)

    assert time.monotonic() - began < 0.9  # the slow call's answer (after 1 s) was not waited for
    assert result.first_unpublished is None
    assert sorted(result.accepted_positions) == list(range(len(entries)))
    assert result.failures_by_code == {"ConnectionError": 1}
    assert max(sum(start <= at < end for start, end in spans) for at, _ in spans) >= 4  # together
    sent = [
        json.loads(entry["Detail"])["id"]
        for _, body in endpoint.received
        for entry in json.loads(body)["Entries"]
    ]
    assert [event for event in sent if event.startswith("o03-")] == ["o03-1", "o03-1", "o03-2"]


def test_a_call_whose_connection_opens_past_its_deadline_is_answered_once_and_never_sent() -> None:
    answers: list[Any] = []
    call = _Call(answers.append, deadline=10.0)
    assert call.next_look(now=9.0, read_timeout=5.0) == 10.0  # connecting: its connect deadline
    assert call.expire(now=10.5) == (True, None)  # the expirer answers it: a connect timeout
    assert not call.attach(cast(Any, "connection"), deadline=15.5)  # opened too late: not sent
    assert not call.claim()  # and no answer after the timeout's
    assert call.next_look(now=10.5, read_timeout=5.0) is None


def test_a_call_sent_just_before_its_connect_deadline_is_held_to_its_read_deadline() -> None:
    call = _Call(lambda _: None, deadline=10.0)
    assert call.attach(cast(Any, "connection"), deadline=14.9)
    assert call.expire(now=10.5) == (False, None)  # not the connect deadline any more
    assert call.next_look(now=10.5, read_timeout=5.0) == 14.9
    assert call.expire(now=14.9) == (True, "connection")


@pytest.mark.parametrize("body", [b"", b"{", b"[1, 2]"])
def test_an_accepted_answer_that_is_not_a_json_object_is_a_botocore_error(
    endpoint: Scripted, body: bytes
) -> None:
    _, crt = clients(endpoint)
    endpoint.answer = (200, {}, body)
    with pytest.raises(BotoCoreError):
        crt.put_events(Entries=ENTRIES)


def test_an_endpoint_that_refuses_the_connection_is_a_botocore_error(endpoint: Scripted) -> None:
    _, crt = clients(endpoint)
    endpoint.shutdown()
    endpoint.server_close()
    with pytest.raises(BotoCoreError):
        crt.put_events(Entries=ENTRIES)


class _ExpiredRefresh(Credentials):
    """Session credentials whose refresh fails, as botocore's refreshable credentials can."""

    def get_frozen_credentials(self) -> Any:
        raise CredentialRetrievalError(provider="container-role", error_msg="refresh failed")


def test_credentials_that_cannot_be_had_are_a_botocore_error_and_nothing_is_sent(endpoint: Scripted) -> None:
    sdk, _ = clients(endpoint)
    with pytest.raises(BotoCoreError):
        CrtPutEvents(sdk, None).put_events(Entries=ENTRIES)
    with pytest.raises(BotoCoreError):
        CrtPutEvents(sdk, _ExpiredRefresh("a", "b")).put_events(Entries=ENTRIES)
    assert endpoint.received == []


class _RefusedRefresh(Credentials):
    """Credentials whose refresh is refused by the service that gives them (an assume-role refresh that
    STS answers AccessDenied): botocore raises the ClientError."""

    def get_frozen_credentials(self) -> Any:
        raise ClientError({"Error": {"Code": "AccessDenied", "Message": "no"}}, "AssumeRole")


def test_a_begun_call_without_credentials_is_answered_with_the_error_and_nothing_is_sent(
    endpoint: Scripted,
) -> None:
    sdk, _ = clients(endpoint)
    answers: queue.SimpleQueue[tuple[Any, Any]] = queue.SimpleQueue()
    for credentials in (None, _ExpiredRefresh("a", "b"), _RefusedRefresh("a", "b")):
        transport = CrtPutEvents(sdk, credentials)
        transport.begin(ENTRIES, labelled(answers, credentials))  # answered, not raised
        _, answer = answers.get_nowait()
        assert isinstance(answer, BotoCoreError | ClientError)
        assert transport.expire_overdue() is None  # nothing left waiting
    assert endpoint.received == []


def test_the_signature_is_the_one_botocore_computes_for_the_request_sent(endpoint: Scripted) -> None:
    _, crt = clients(endpoint)
    endpoint.answer = (200, {}, b'{"FailedEntryCount": 0, "Entries": [{"EventId": "a"}, {"EventId": "b"}]}')
    crt.put_events(Entries=ENTRIES)
    [(headers, body)] = endpoint.received
    algorithm, _, fields = headers["authorization"].partition(" ")
    parts = dict(part.strip().split("=", 1) for part in fields.split(","))
    assert algorithm == "AWS4-HMAC-SHA256"
    amz_date = headers["x-amz-date"]
    assert parts["Credential"] == f"AKIDEXAMPLE/{amz_date[:8]}/eu-west-1/events/aws4_request"
    signed = parts["SignedHeaders"].split(";")
    assert {"host", "x-amz-date", "x-amz-security-token", "x-amz-target", "content-type"} <= set(signed)
    # botocore's SigV4 over the same method, URL, signed headers, body and time
    request = AWSRequest(
        method="POST",
        url=f"{endpoint.endpoint}/",
        headers={name: headers[name] for name in signed},
        data=body,
    )
    request.context["timestamp"] = amz_date
    signer = SigV4Auth(Credentials("AKIDEXAMPLE", "secret", "token"), "events", "eu-west-1")
    assert signer.signed_headers(signer.headers_to_sign(request)) == parts["SignedHeaders"]
    expected = signer.signature(signer.string_to_sign(request, signer.canonical_request(request)), request)
    assert parts["Signature"] == expected
    assert (
        abs(
            (
                datetime.now(UTC) - datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
            ).total_seconds()
        )
        < 60
    )


def test_events_sent_through_it_reach_the_local_stacks_bus_as_the_sdks_do(
    local_services: LocalServices, monkeypatch: pytest.MonkeyPatch, session_credentials: None
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_EVENTS", local_services.endpoints.moto)
    monkeypatch.setenv("AWS_ENDPOINT_URL_EVENTBRIDGE", local_services.endpoints.moto)
    aws.reset_clients()
    try:
        sdk: Any = aws.events()  # called with the same plain dicts as the transport
        crt = aws.events_over_crt()
        bus = f"transport-{time.time_ns()}"
        sdk.create_event_bus(Name=bus)
        entries = [{**entry, "EventBusName": bus} for entry in ENTRIES]
        assert crt.put_events(Entries=entries)["FailedEntryCount"] == 0
        with pytest.raises(ClientError) as missing_bus_crt:
            crt.put_events(Entries=[{**ENTRIES[0], "EventBusName": f"{bus}-missing"}])
        with pytest.raises(ClientError) as missing_bus_sdk:
            sdk.put_events(Entries=[{**ENTRIES[0], "EventBusName": f"{bus}-missing"}])
        assert missing_bus_crt.value.response["Error"] == missing_bus_sdk.value.response["Error"]
    finally:
        aws.reset_clients()
