"""boto3 calls that also return the response's JSON as it arrived, for what the pollers hand functions.

Lambda delivers a DynamoDB stream record as GetRecords returned it (ApproximateCreationDateTime in epoch
seconds, binary attribute values in base64) and an SQS message's binary attributes in base64; botocore's
parsed response turns those into datetime and bytes. keep_raw_json(client, operation, ...) registers a
handler for botocore's `before-parse.<service id>.<operation>` event on that client: botocore emits it
with the HTTP response (`response_dict`, its `body` still bytes) before parsing, and merges what the
handler puts in `customized_response_dict` into the parsed response (botocore/endpoint.py,
Endpoint._do_get_response). The body's JSON is kept there under RAW_JSON; raw_json(response) reads it.

Everything else is boto3's own: signing, retries, connection pooling, and errors (ClientError with the
code botocore reports, EndpointConnectionError when the service is not there). Only a successful
response's body that is not JSON is an error of this module's: UnreadableResponse, a BotoCoreError,
which the pollers report and carry on after.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, cast

from botocore.exceptions import BotoCoreError

RAW_JSON = "RawJson"


class UnreadableResponse(BotoCoreError):
    """A successful response whose body is not JSON."""

    fmt = "{operation}: unreadable response (HTTP {status}): {body!r}"


def keep_raw_json[Client](client: Client, *operations: str) -> Client:
    """Make these operations of a JSON-protocol boto3 client also return their JSON (raw_json); the same
    client, for chaining. Registering twice changes nothing."""
    meta = cast(Any, client).meta  # a boto3 client (its stubs type meta per service)
    model = meta.service_model
    if model.resolved_protocol != "json":
        raise ValueError(f"{model.service_id} does not answer in JSON ({model.resolved_protocol})")
    service = model.service_id.hyphenize()
    for operation in operations:
        model.operation_model(operation)  # OperationNotFoundError for a misspelt name
        meta.events.register(
            f"before-parse.{service}.{operation}",
            _keep_body_json,
            unique_id=f"tools.local.raw_json:{service}.{operation}",
        )
    return client


def raw_json(response: Mapping[str, object]) -> dict[str, Any]:
    """The JSON of a response of an operation keep_raw_json registered."""
    return cast(dict[str, Any], response[RAW_JSON])


def _keep_body_json(
    response_dict: dict[str, Any], customized_response_dict: dict[str, Any], operation_model: Any, **_: Any
) -> None:
    status = response_dict["status_code"]
    if status >= 300:
        return  # an error: botocore parses it into the ClientError it raises
    body: bytes = response_dict["body"]
    try:
        customized_response_dict[RAW_JSON] = json.loads(body) if body else {}
    except ValueError as exc:
        raise UnreadableResponse(operation=operation_model.name, status=status, body=body[:200]) from exc
