"""AWS JSON-protocol calls as plain HTTP POSTs to the local emulators, for the pollers' hot loops.

Why not boto3 there: per call, botocore builds, validates and signs the request and parses the response
into typed values, about 0.9 ms of CPU in the stack's process against 0.1 ms for the POST alone (an
empty SQS receive from moto); the pollers make several calls per order, and what they hand to functions
is the JSON as it arrived (a stream record, a message's base64 binary attributes), which botocore's
parsed form changes or drops. The request is what botocore sends for the service's JSON protocol (the
target prefix and JSON version come from botocore's own service model); DynamoDB Local and moto check
no signature, so the Authorization header only names the access key. Errors are raised as botocore's
ClientError with the code botocore would report, connection failures as EndpointConnectionError.
"""

from __future__ import annotations

import http.client
import json
import threading
import urllib.parse
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError

from tools.template import REGION

# As the stack's boto3 clients (emulators._CLIENT_CONFIG): 10 s reads, 3 attempts on a dropped
# connection or a server error.
_TIMEOUT_SECONDS = 10.0
_ATTEMPTS = 3


class UnreadableResponse(BotoCoreError):
    """A response body that is not JSON: a BotoCoreError, which the pollers report and carry on after."""

    fmt = "{operation}: unreadable response (HTTP {status}): {body!r}"


class JsonApi:
    """One service's JSON-protocol operations at one endpoint; safe to call from any thread (connections
    are kept alive and shared through a pool, as botocore's are)."""

    def __init__(
        self, endpoint_url: str, target_prefix: str, json_version: str, signing_name: str, access_key: str
    ) -> None:
        self._endpoint_url = endpoint_url
        address = urllib.parse.urlsplit(endpoint_url)
        self._host, self._port = address.hostname or "127.0.0.1", address.port
        self._target_prefix = target_prefix
        self._headers = {
            "Content-Type": f"application/x-amz-json-{json_version}",
            "Authorization": (
                f"AWS4-HMAC-SHA256 Credential={access_key}/20240101/{REGION}/{signing_name}/aws4_request, "
                "SignedHeaders=host, Signature=0"
            ),
        }
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    @classmethod
    def like(cls, client: Any, access_key: str) -> JsonApi:
        """The same service and endpoint as a boto3 client of a JSON-protocol service."""
        metadata = client.meta.service_model.metadata
        if metadata.get("protocol") != "json":
            raise ValueError(f"{metadata.get('serviceId')} does not speak the JSON protocol")
        return cls(
            client.meta.endpoint_url,
            metadata["targetPrefix"],
            metadata["jsonVersion"],
            metadata.get("signingName") or metadata["endpointPrefix"],
            access_key,
        )

    def call(self, operation: str, params: dict[str, Any]) -> dict[str, Any]:
        """The operation's response as JSON; ClientError when the service answers with an error."""
        body = json.dumps(params).encode()
        headers = {**self._headers, "X-Amz-Target": f"{self._target_prefix}.{operation}"}
        status, query_error, raw = self._post(body, headers)
        try:
            data: dict[str, Any] = json.loads(raw) if raw else {}
        except ValueError as exc:
            raise UnreadableResponse(operation=operation, status=status, body=raw[:200]) from exc
        if status == 200:
            return data
        # awsQueryCompatible services (SQS) name the error as their query API did, as botocore reports it.
        code = query_error.split(";", 1)[0] if query_error else ""
        code = code or str(data.get("__type", f"HTTP{status}")).rsplit("#", 1)[-1]
        message = str(data.get("message", data.get("Message", "")))
        error: Any = {
            "Error": {"Code": code, "Message": message},
            "ResponseMetadata": {"HTTPStatusCode": status},
        }
        raise ClientError(error, operation)

    def _post(self, body: bytes, headers: dict[str, str]) -> tuple[int, str, bytes]:
        attempt = 1
        while True:
            connection, reused = self._connection()
            try:
                connection.request("POST", "/", body, headers)
                response = connection.getresponse()
                raw = response.read()
            except (OSError, http.client.HTTPException) as exc:
                connection.close()
                if reused:
                    # A kept-alive connection the server closed while it was idle (the others idle as
                    # long are likely closed too): again on a new one, not counted as an attempt.
                    self.close()
                    continue
                if attempt == _ATTEMPTS:
                    raise EndpointConnectionError(endpoint_url=self._endpoint_url, error=exc) from exc
            else:
                if response.will_close:
                    connection.close()
                else:
                    with self._lock:
                        self._idle.append(connection)
                if response.status < 500 or attempt == _ATTEMPTS:
                    return response.status, response.getheader("x-amzn-query-error", ""), raw
            attempt += 1

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        """A kept-alive connection (True) if one is idle, else a new one (False)."""
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        return http.client.HTTPConnection(self._host, self._port, timeout=_TIMEOUT_SECONDS), False

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()
