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

import hashlib
import http.client
import io
import json
import threading
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, cast
from urllib.parse import urlsplit

import awscrt
from awscrt import auth
from awscrt import http as crt_http
from awscrt import io as crt_io
from botocore.credentials import Credentials
from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    HTTPClientError,
    NoCredentialsError,
    ReadTimeoutError,
)

_TARGET = "AWSEvents.PutEvents"
_CONTENT_TYPE = "application/x-amz-json-1.1"  # EventBridge speaks the AWS JSON 1.1 protocol
_USER_AGENT = f"shop-outbox-publisher awscrt/{awscrt.__version__}"


class CrtPutEvents:
    """`put_events(Entries=...)` for one endpoint; thread-safe: one connection per calling thread, as the
    publisher keeps up to PUBLISH_CONCURRENCY calls in flight from its worker threads."""

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
        self._local = threading.local()

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

    def put_events(self, *, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        body = json.dumps({"Entries": Entries}).encode()
        signing = self._signing(body)
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
        try:
            signed = auth.aws_sign_request(request, signing).result()
        except Exception as exc:  # awscrt's errors, whatever their class: nothing was sent
            raise HTTPClientError(error=exc) from exc
        status, headers, answer = self._exchange(signed)
        if 200 <= status < 300:  # what botocore returns as a result
            try:
                parsed = json.loads(answer)
            except ValueError:
                parsed = None
            if not isinstance(parsed, dict):  # a cut or foreign answer: whether the call landed is unknown
                raise HTTPClientError(
                    error=ValueError(f"PutEvents answer is not a JSON object: {answer[:200]!r}")
                )
            return parsed
        raise ClientError(cast("Any", error_response(status, headers, answer)), "PutEvents")

    def _connection(self) -> crt_http.HttpClientConnection:
        connection: crt_http.HttpClientConnection | None = getattr(self._local, "connection", None)
        if connection is not None and connection.is_open():
            return connection
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
        try:
            connection = opening.result(self._connect_timeout + 1)
        except FutureTimeout as exc:
            raise ConnectTimeoutError(endpoint_url=self.endpoint_url) from exc
        except Exception as exc:  # awscrt's errors, whatever their class
            raise EndpointConnectionError(endpoint_url=self.endpoint_url) from exc
        self._local.connection = connection
        return connection

    def _exchange(self, request: crt_http.HttpRequest) -> tuple[int, dict[str, str], bytes]:
        connection = self._connection()
        status: list[int] = []
        answer_headers: dict[str, str] = {}
        chunks: list[bytes] = []

        # awscrt calls back with keyword arguments: the parameters keep its names.
        def on_response(status_code: int, headers: list[tuple[str, str]], **_: Any) -> None:
            status.append(status_code)
            answer_headers.update((name.lower(), value) for name, value in headers)

        def on_body(chunk: bytes, **_: Any) -> None:
            chunks.append(bytes(chunk))

        try:
            stream = connection.request(request, on_response=on_response, on_body=on_body)
            stream.activate()
            stream.completion_future.result(self._read_timeout)
        except FutureTimeout as exc:
            connection.close()  # its answer may still come: it must not be read as the next call's
            raise ReadTimeoutError(endpoint_url=self.endpoint_url) from exc
        except Exception as exc:  # awscrt's errors, whatever their class (a callback's included)
            connection.close()
            raise HTTPClientError(error=exc) from exc
        if not status:
            raise HTTPClientError(error=ValueError("the connection ended without an answer"))
        return status[0], answer_headers, b"".join(chunks)


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
