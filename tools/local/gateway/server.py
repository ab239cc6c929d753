"""API Gateway (REST API, Lambda proxy integration) on 127.0.0.1, routed by the template's Api events.

Each request becomes the proxy event (version 1.0) the function gets in the cloud, and the function's
answer becomes the HTTP response. Paths work with or without the stage prefix (/orders and
/dev/orders); requestContext.path is the path the client used, as with the execute-api domain.
Authorization is not enforced locally, but every request gets the identity of an IAM user, as a
SigV4-signed request does behind AWS_IAM auth: requestContext.identity.userArn is
arn:aws:iam::<account>:user/<name>, the name taken from the X-Local-Caller header (default local-user).
Functions that scope data to the caller (the order API's Idempotency-Key) can so be tried with several.

Requests under /_local/ go to the local inspector (tools/local/inspector) instead of a function: the
stack's own pages, never part of the deployed API. Requests under /2015-03-31/ go to Lambda's Invoke API
for the stack's functions (gateway/lambda_api.py). A template route under either prefix is refused.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import time
import uuid
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlsplit

from tools.local.console.activity import ActivityLog, Invocation
from tools.local.pollers.event_sources import ApiRoute
from tools.local.processes import LOOPBACK, StartupError, ensure_port_free
from tools.local.runtime.functions import SYNC_PAYLOAD_LIMIT, FunctionRuntime, InvocationResult
from tools.template import ACCOUNT

_PARAMETER = re.compile(r"\{([^}]+)\}")
_MISSING_TOKEN = {"message": "Missing Authentication Token"}
_INTERNAL_ERROR = {"message": "Internal server error"}
LOCAL_CALLER_HEADER = "X-Local-Caller"
LOCAL_PREFIX = "/_local"  # the local inspector's pages and JSON API
LAMBDA_API_PREFIX = "/2015-03-31"  # Lambda's Invoke API: POST /2015-03-31/functions/{name}/invocations
# What the local stack serves beside the template's routes, which may not use these prefixes.
_RESERVED_PREFIXES = {LOCAL_PREFIX: "its inspector", LAMBDA_API_PREFIX: "Lambda's Invoke API"}
DEFAULT_LOCAL_CALLER = "local-user"


def local_caller_arn(name: str = DEFAULT_LOCAL_CALLER) -> str:
    """The IAM user ARN the local API gives a request from caller `name`."""
    return f"arn:aws:iam::{ACCOUNT}:user/{name}"


class RouteConflict(ValueError):
    pass


def is_under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + "/")


@dataclass(frozen=True)
class _CompiledRoute:
    route: ApiRoute
    stage: str
    pattern: re.Pattern[str]
    literal_segments: int
    greedy: bool


def _compile(path: str) -> tuple[re.Pattern[str], int, bool]:
    segments = [s for s in path.strip("/").split("/") if s]
    parts: list[str] = []
    literal = 0
    greedy = False
    for segment in segments:
        match = _PARAMETER.fullmatch(segment)
        if match is None:
            parts.append(re.escape(segment))
            literal += 1
        elif match.group(1).endswith("+"):
            parts.append(f"(?P<{_group(match.group(1)[:-1])}>.+)")
            greedy = True
        else:
            parts.append(f"(?P<{_group(match.group(1))}>[^/]+)")
    return re.compile("/" + "/".join(parts) if parts else "/"), literal, greedy


def _group(name: str) -> str:
    # Regex group names must be identifiers; API parameter names may contain '-' or '.'.
    return "p_" + "".join(c if c.isalnum() else f"_{ord(c):x}_" for c in name)


def _parameter_names(path: str) -> list[str]:
    return [name.rstrip("+") for name in _PARAMETER.findall(path)]


class RouteTable:
    def __init__(self, routes: list[ApiRoute], stages: dict[str, str]) -> None:
        compiled: list[_CompiledRoute] = []
        seen: dict[tuple[str, str], ApiRoute] = {}
        for route in routes:
            for prefix, served in _RESERVED_PREFIXES.items():
                if is_under(route.path, prefix):
                    raise RouteConflict(
                        f"{route.method} {route.path} ({route.function}.{route.name}) is under {prefix}, "
                        f"where the local stack serves {served}"
                    )
            key = (route.method, _compile(route.path)[0].pattern)
            if key in seen:
                other = seen[key]
                raise RouteConflict(
                    f"{route.method} {route.path} is defined by {other.function}.{other.name} and "
                    f"{route.function}.{route.name}; one local server cannot serve both"
                )
            seen[key] = route
            pattern, literal, greedy = _compile(route.path)
            compiled.append(_CompiledRoute(route, stages.get(route.api, "Prod"), pattern, literal, greedy))
        # API Gateway prefers literal segments over parameters, and parameters over greedy paths.
        self._routes = sorted(compiled, key=lambda r: (r.greedy, -r.literal_segments))
        self.stages = {r.stage for r in compiled}

    def match(self, method: str, path: str) -> tuple[_CompiledRoute, dict[str, str], str] | None:
        """The route, its path parameters and the resource path (stage prefix removed)."""
        candidates = [path]
        first, _, rest = path.lstrip("/").partition("/")
        if first in self.stages:
            candidates.append("/" + rest)
        for candidate in candidates:
            for compiled in self._routes:
                if compiled.route.method not in {method, "ANY"}:
                    continue
                found = compiled.pattern.fullmatch(candidate)
                if found is not None:
                    names = _parameter_names(compiled.route.path)
                    return compiled, dict(zip(names, found.groups(), strict=True)), candidate
        return None


def _request_time(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%d/%b/%Y:%H:%M:%S +0000")


def proxy_event(
    *,
    method: str,
    raw_path: str,
    resource_path: str,
    route: _CompiledRoute,
    path_parameters: dict[str, str],
    query: str,
    header_pairs: list[tuple[str, str]],
    body: bytes,
    source_ip: str,
    api_id: str,
) -> dict[str, Any]:
    """The API Gateway REST proxy event (payload format 1.0) for one request."""
    headers: dict[str, str] = {}
    multi_headers: dict[str, list[str]] = {}
    for name, value in header_pairs:
        existing = next((k for k in multi_headers if k.lower() == name.lower()), name)
        multi_headers.setdefault(existing, []).append(value)
        headers[existing] = value  # the single-value form keeps the last value
    query_pairs = parse_qsl(query, keep_blank_values=True)
    multi_query: dict[str, list[str]] = {}
    for name, value in query_pairs:
        multi_query.setdefault(name, []).append(value)
    try:
        text: str | None = body.decode() if body else None
        is_base64 = False
    except UnicodeDecodeError:
        text, is_base64 = base64.b64encode(body).decode(), True
    now = time.time()
    request_id = str(uuid.uuid4())
    caller = next((v for k, v in headers.items() if k.lower() == LOCAL_CALLER_HEADER.lower()), "")
    return {
        "resource": route.route.path,
        "path": resource_path,
        "httpMethod": method,
        "headers": headers or None,
        "multiValueHeaders": multi_headers or None,
        "queryStringParameters": {k: v[-1] for k, v in multi_query.items()} or None,
        "multiValueQueryStringParameters": multi_query or None,
        "pathParameters": path_parameters or None,
        "stageVariables": None,
        "requestContext": {
            "accountId": ACCOUNT,
            "apiId": api_id,
            "resourceId": format(zlib.crc32(route.route.path.encode()) % 0xFFFFFF, "06x"),
            "resourcePath": route.route.path,
            "httpMethod": method,
            "extendedRequestId": request_id,
            "requestId": request_id,
            "requestTime": _request_time(now),
            "requestTimeEpoch": int(now * 1000),
            "path": raw_path,
            "stage": route.stage,
            "protocol": "HTTP/1.1",
            "domainName": headers.get("Host", LOOPBACK),
            "identity": {
                "cognitoIdentityPoolId": None,
                "accountId": ACCOUNT,
                "cognitoIdentityId": None,
                "caller": None,
                "accessKey": None,
                "sourceIp": source_ip,
                "cognitoAuthenticationType": None,
                "cognitoAuthenticationProvider": None,
                "userArn": local_caller_arn(caller.strip() or DEFAULT_LOCAL_CALLER),
                "userAgent": headers.get("User-Agent"),
                "user": None,
            },
        },
        "body": text,
        "isBase64Encoded": is_base64,
    }


@dataclass(frozen=True)
class HttpAnswer:
    status: int
    headers: list[tuple[str, str]]
    body: bytes


def json_answer(
    status: int,
    document: dict[str, Any],
    error_type: str | None = None,
    extra: list[tuple[str, str]] | None = None,
) -> HttpAnswer:
    """A JSON document, with the error type AWS's SDKs read the error code from (x-amzn-ErrorType)."""
    headers = [("Content-Type", "application/json")]
    if error_type:
        headers.append(("x-amzn-ErrorType", error_type))
    return HttpAnswer(status, headers + (extra or []), json.dumps(document).encode())


def _not_a_proxy_response(payload: Any) -> str | None:
    """Why a result is not the proxy integration's output format, or None. AWS: "If the function runs but
    returns an error, or returns a response in the wrong format, API Gateway returns a 502"
    (https://docs.aws.amazon.com/lambda/latest/dg/services-apigateway-errors.html); the format: statusCode,
    headers (a map), multiValueHeaders (a map of lists), body (a string), isBase64Encoded
    (https://docs.aws.amazon.com/apigateway/latest/developerguide/set-up-lambda-proxy-integrations.html)."""
    if not isinstance(payload, dict) or type(payload.get("statusCode")) is not int:
        return "no integer statusCode"
    if not isinstance(payload.get("headers") or {}, dict):
        return "headers is not a map"
    multi = payload.get("multiValueHeaders") or {}
    if not isinstance(multi, dict) or not all(isinstance(v, list) for v in multi.values()):
        return "multiValueHeaders is not a map of lists"
    if payload.get("body") is not None and not isinstance(payload["body"], str):
        return "body is not a string"
    if payload.get("isBase64Encoded"):
        try:
            base64.b64decode(payload.get("body") or "", validate=True)
        except ValueError:
            return "body is not base64 though isBase64Encoded"
    if len(json.dumps(payload).encode()) > SYNC_PAYLOAD_LIMIT:
        return "the response is over Lambda's 6 MB"
    return None


def http_answer(result: InvocationResult) -> HttpAnswer:
    """The HTTP response API Gateway makes of a proxy integration's result."""
    payload = result.payload
    if not result.ok or _not_a_proxy_response(payload) is not None:
        return json_answer(HTTPStatus.BAD_GATEWAY, _INTERNAL_ERROR, "InternalServerErrorException")
    headers: list[tuple[str, str]] = []
    multi = payload.get("multiValueHeaders") or {}
    for name, values in multi.items():
        headers.extend((name, str(v)) for v in values)
    for name, value in (payload.get("headers") or {}).items():
        if name not in multi:  # multiValueHeaders win when both name a header
            headers.append((name, str(value)))
    raw = payload.get("body") or ""
    body = base64.b64decode(raw) if payload.get("isBase64Encoded") else raw.encode()
    return HttpAnswer(int(payload["statusCode"]), headers, body)


class LocalPages(Protocol):
    """What serves a prefix of the stack's own: LOCAL_PREFIX (tools.local.inspector.api.InspectorApi, which
    records nothing in the activity log, so the page's polling adds no line), LAMBDA_API_PREFIX
    (tools.local.gateway.lambda_api.LambdaApi, which records its invocations)."""

    def handle(self, method: str, target: str, headers: list[tuple[str, str]], body: bytes) -> HttpAnswer: ...


class _Server(ThreadingHTTPServer):
    # Connections queued while every request thread is starting (the default of 5 resets bursts).
    request_queue_size = 128
    daemon_threads = True


class ApiServer:
    """A threading HTTP server in front of the functions: one thread per connection, so requests run
    concurrently, each on an execution environment of its function's pool."""

    def __init__(
        self,
        routes: RouteTable,
        functions: dict[str, FunctionRuntime],
        api_ids: dict[str, str],
        activity: ActivityLog,
        port: int,
        served: Mapping[str, LocalPages] | None = None,
    ) -> None:
        self.routes = routes
        unknown = set(served or {}) - set(_RESERVED_PREFIXES)
        if unknown:
            raise ValueError(f"not a prefix the local stack reserves: {', '.join(sorted(unknown))}")
        self._served = dict(served or {})  # prefix -> what serves it, instead of the template's routes
        self._functions = functions
        self._api_ids = api_ids
        self._activity = activity
        if port:
            ensure_port_free(port, "the local API")
        try:
            self._server = _Server((LOOPBACK, port), self._handler_class())
        except OSError as exc:
            raise StartupError(f"the local API cannot listen on {LOOPBACK}:{port}: {exc}") from exc
        self._thread = threading.Thread(target=self._server.serve_forever, name="api", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()  # waits for serve_forever, so only when it runs
            self._thread.join(timeout=5)
        self._server.server_close()

    def handle(
        self, method: str, target: str, header_pairs: list[tuple[str, str]], body: bytes, source_ip: str
    ) -> HttpAnswer:
        parts = urlsplit(target)
        for prefix, pages in self._served.items():
            if is_under(parts.path, prefix):
                return pages.handle(method, target, header_pairs, body)
        found = self.routes.match(method, parts.path or "/")
        if found is None:
            return json_answer(HTTPStatus.FORBIDDEN, _MISSING_TOKEN, "MissingAuthenticationTokenException")
        route, parameters, resource_path = found
        event = proxy_event(
            method=method,
            raw_path=parts.path,
            resource_path=resource_path,
            route=route,
            path_parameters=parameters,
            query=parts.query,
            header_pairs=header_pairs,
            body=body,
            source_ip=source_ip,
            api_id=self._api_ids.get(route.route.api, route.route.api),
        )
        if len(json.dumps(event).encode()) > SYNC_PAYLOAD_LIMIT:
            # Lambda refuses the invocation (its 6 MB request payload), and "if the Lambda API rejects the
            # invocation request, API Gateway returns a 500" (services-apigateway-errors): the function
            # never runs, and nothing is recorded as its invocation.
            error = "InternalServerErrorException"
            return json_answer(HTTPStatus.INTERNAL_SERVER_ERROR, _INTERNAL_ERROR, error)
        result = self._functions[route.route.function].invoke(event)
        answer = http_answer(result)
        self._activity.add(
            Invocation(
                function=route.route.function,
                trigger="api",
                source=f"{method} {route.route.path}",
                event=event,
                result=result,
                failed_ids=() if result.ok else (event["requestContext"]["requestId"],),
            )
        )
        return answer

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                answer = server.handle(
                    self.command, self.path, list(self.headers.items()), body, self.client_address[0]
                )
                try:
                    self.send_response(answer.status)
                    for name, value in answer.headers:
                        if name.lower() not in {"content-length", "connection"}:
                            self.send_header(name, value)
                    self.send_header("Content-Length", str(len(answer.body)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(answer.body)
                except (BrokenPipeError, ConnectionResetError):
                    # The client hung up (a client timeout): as behind API Gateway, the function has run
                    # and its effects stand; only the answer is lost.
                    self.close_connection = True

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _serve

            def log_message(self, format: str, *args: Any) -> None:
                pass  # the console shows one line per request instead

        return Handler
