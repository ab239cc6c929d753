"""What a function's partial batch response reports, read as Lambda reads it for SQS and DynamoDB Streams
alike: "Lambda treats a batch as a complete success if your function returns: an empty batchItemFailures
list, a null batchItemFailures list, an empty EventResponse, a null EventResponse", and "as a complete
failure if your function returns: an invalid JSON response, an empty string itemIdentifier, a null
itemIdentifier, an itemIdentifier with a bad key name, an itemIdentifier value with a message ID that
doesn't exist" ("Handling errors for an SQS event source in Lambda",
https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-errorhandling.html; the same conditions in
"Configuring partial batch response with DynamoDB and Lambda",
https://docs.aws.amazon.com/lambda/latest/dg/services-ddb-batchfailurereporting.html). A response that
is not an object (a string, a number, a list) or whose batchItemFailures is not a list is not the
documented shape: read as an invalid response, a complete failure, never as a success that would delete
or checkpoint past records the function did not handle."""

from __future__ import annotations

from typing import Any


class InvalidBatchResponse(ValueError):
    """The response says nothing a batch can be judged by: the whole batch failed."""


def reported_identifiers(payload: Any) -> list[str]:
    """The itemIdentifiers a response reports as failed (empty: a complete success); InvalidBatchResponse
    for a complete failure."""
    if payload is None:
        return []
    if not isinstance(payload, dict):
        raise InvalidBatchResponse(f"the response is a {type(payload).__name__}, not an object")
    failures = payload.get("batchItemFailures")
    if failures is None:
        return []
    if not isinstance(failures, list):
        raise InvalidBatchResponse("batchItemFailures is not a list")
    identifiers = []
    for failure in failures:
        identifier = failure.get("itemIdentifier") if isinstance(failure, dict) else None
        if not isinstance(identifier, str) or not identifier:
            raise InvalidBatchResponse(f"an invalid itemIdentifier: {failure!r}"[:200])
        identifiers.append(identifier)
    return identifiers
