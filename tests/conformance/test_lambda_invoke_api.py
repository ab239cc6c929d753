"""Lambda's Invoke API on the local API's port (tools/local/gateway/lambda_api.py), driven by a real boto3
Lambda client as `python -m operations --local` drives it (operations/admin.py: invoke_order_store).

AWS Lambda API reference, "Invoke" (https://docs.aws.amazon.com/lambda/latest/api/API_Invoke.html):
- `POST /2015-03-31/functions/FunctionName/invocations`; FunctionName is the name, the ARN or a partial ARN,
  a version or alias appended to any of them, or given as Qualifier.
- StatusCode: "For the RequestResponse invocation type, this status code is 200 ... For the DryRun
  invocation type, the status code is 204"; Payload: "The response from the function, or an error object".
- "The status code in the API response doesn't reflect function errors": FunctionError ("If present,
  indicates that an error occurred during function execution. Details about the error are included in
  the response payload"), the object the runtime reports: errorMessage, errorType, stackTrace.
- Errors: ResourceNotFoundException (404), InvalidRequestContentException ("The request body could not be
  parsed as JSON", 400), TooManyRequestsException (429), InvalidParameterValueException (400). Lambda is
  a rest-json service: botocore raises the exception the `x-amzn-ErrorType` header names.
Not served locally (refused with InvalidParameterValueException, saying so): InvocationType Event and
LogType Tail.

The functions run in FunctionRuntime's worker processes, as the stack runs them, behind the stack's
ApiServer; no services are started (the functions here call none).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config

from tools.local.console.activity import ActivityLog
from tools.local.gateway.lambda_api import SOURCE, LambdaApi
from tools.local.gateway.server import LAMBDA_API_PREFIX, ApiServer, RouteConflict, RouteTable
from tools.local.pollers.event_sources import ApiRoute
from tools.local.runtime.context import function_arn
from tools.local.runtime.functions import FunctionRuntime, function_environment
from tools.local.services.emulators import FAKE_CREDENTIALS, Endpoints
from tools.template import ACCOUNT, REGION, FunctionSpec

ECHO = "local-EchoFunction"
THROTTLED = "local-ThrottledFunction"
HANDLER = """
def handler(event, context):
    if isinstance(event, dict) and "fail" in event:
        raise ValueError(event["fail"])
    return {"received": event, "requestId": context.aws_request_id}
"""


class Lambda:
    """The server in front of the functions, and a boto3 client of its Invoke API."""

    def __init__(self, server: ApiServer, activity: ActivityLog) -> None:
        self.activity = activity
        self.client: Any = boto3.session.Session(  # Any: the tests send what the stubs' Literals refuse
            aws_access_key_id=FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=REGION,
        ).client("lambda", endpoint_url=server.url, config=Config(retries={"total_max_attempts": 1}))

    def invoke(self, function_name: str = ECHO, payload: Any = None, **options: Any) -> dict[str, Any]:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        response = dict(self.client.invoke(FunctionName=function_name, Payload=body, **options))
        raw = response["Payload"].read()
        response["Payload"] = json.loads(raw) if raw else None
        return response


@pytest.fixture(scope="module")
def lambda_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lambda]:
    code_dir = tmp_path_factory.mktemp("invoke-code")
    (code_dir / "echo.py").write_text(HANDLER)
    endpoints = Endpoints(dynamodb="http://127.0.0.1:9", moto="http://127.0.0.1:9")  # never called
    functions: dict[str, FunctionRuntime] = {}
    for name, reserved in ((ECHO, None), (THROTTLED, 0)):
        logical_id = name.removeprefix("local-")
        spec = FunctionSpec(
            logical_id,
            code_dir,
            "echo.handler",
            5,
            {},
            {},
            runtime="python3.13",
            reserved_concurrency=reserved,
        )
        functions[logical_id] = FunctionRuntime(
            spec, name, function_environment(spec, name, endpoints), code_dir / f"{logical_id}.log"
        )
    activity = ActivityLog()
    server = ApiServer(
        RouteTable([], {}), functions, {}, activity, 0, {LAMBDA_API_PREFIX: LambdaApi(functions, activity)}
    )
    server.start()
    try:
        yield Lambda(server, activity)
    finally:
        server.stop()
        for runtime in functions.values():
            runtime.stop()


def test_request_response_answers_200_with_the_functions_result(lambda_api: Lambda) -> None:
    response = lambda_api.invoke(payload={"replay": {"eventIds": ["e-1"]}})

    assert response["StatusCode"] == 200
    assert "FunctionError" not in response
    assert response["ExecutedVersion"] == "$LATEST"
    # The API's request id is the invocation's (context.aws_request_id), as in Lambda.
    request_id = response["ResponseMetadata"]["RequestId"]
    assert response["Payload"] == {"received": {"replay": {"eventIds": ["e-1"]}}, "requestId": request_id}


@pytest.mark.parametrize(
    ("function_name", "options"),
    [
        (function_arn(ECHO), {}),
        (f"{ACCOUNT}:function:{ECHO}", {}),  # a partial ARN
        (f"{ECHO}:$LATEST", {}),
        (function_arn(ECHO, "$LATEST"), {}),
        (ECHO, {"Qualifier": "$LATEST"}),
    ],
)
def test_the_function_name_may_be_its_arn_or_a_partial_arn_with_or_without_latest(
    lambda_api: Lambda, function_name: str, options: dict[str, str]
) -> None:
    response = lambda_api.invoke(function_name, {"n": 1}, **options)

    assert (response["StatusCode"], response["Payload"]["received"]) == (200, {"n": 1})


def test_a_function_error_is_a_200_with_x_amz_function_error_and_the_runtimes_error_object(
    lambda_api: Lambda,
) -> None:
    response = lambda_api.invoke(payload={"fail": "no such order"})

    assert response["StatusCode"] == 200, "the status code doesn't reflect function errors"
    assert response["FunctionError"] == "Unhandled"
    error = response["Payload"]
    assert {key: error[key] for key in ("errorType", "errorMessage")} == {
        "errorType": "ValueError",
        "errorMessage": "no such order",
    }
    assert isinstance(error["stackTrace"], list)
    assert error["stackTrace"], "the frames the runtime reports"


@pytest.mark.parametrize(
    ("function_name", "options", "missing"),
    [
        ("local-NoSuchFunction", {}, function_arn("local-NoSuchFunction")),
        (function_arn("local-NoSuchFunction"), {}, function_arn("local-NoSuchFunction")),
        (ECHO, {"Qualifier": "live"}, function_arn(ECHO, "live")),  # no versions or aliases locally
        (f"arn:aws:lambda:eu-west-1:{ACCOUNT}:function:{ECHO}", {}, None),  # another region's
    ],
)
def test_an_unknown_function_raises_resource_not_found(
    lambda_api: Lambda, function_name: str, options: dict[str, str], missing: str | None
) -> None:
    client = lambda_api.client

    with pytest.raises(client.exceptions.ResourceNotFoundException) as raised:
        client.invoke(FunctionName=function_name, Payload=b"{}", **options)

    error = raised.value.response
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 404
    assert error["Error"]["Message"] == f"Function not found: {missing or function_name}"


def test_an_empty_payload_is_an_empty_object_and_one_that_is_not_json_is_refused(lambda_api: Lambda) -> None:
    client = lambda_api.client

    empty = client.invoke(FunctionName=ECHO)
    with pytest.raises(client.exceptions.InvalidRequestContentException) as raised:
        client.invoke(FunctionName=ECHO, Payload=b"{not json")

    assert json.loads(empty["Payload"].read())["received"] == {}
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400


def test_dry_run_answers_204_and_runs_nothing(lambda_api: Lambda) -> None:
    before = len(lambda_api.activity.invocations())

    response = lambda_api.client.invoke(FunctionName=ECHO, InvocationType="DryRun", Payload=b"{}")

    assert response["StatusCode"] == 204
    assert len(lambda_api.activity.invocations()) == before


@pytest.mark.parametrize(
    ("options", "said"),
    [({"InvocationType": "Event"}, "InvocationType Event"), ({"LogType": "Tail"}, "LogType Tail")],
)
def test_what_the_local_stack_does_not_serve_is_refused_saying_so(
    lambda_api: Lambda, options: dict[str, str], said: str
) -> None:
    client = lambda_api.client
    before = len(lambda_api.activity.invocations())

    with pytest.raises(client.exceptions.InvalidParameterValueException, match=said):
        client.invoke(FunctionName=ECHO, Payload=b"{}", **options)

    assert len(lambda_api.activity.invocations()) == before, "nothing ran"


def test_beyond_the_functions_reserved_concurrency_the_invocation_is_throttled(lambda_api: Lambda) -> None:
    client = lambda_api.client

    with pytest.raises(client.exceptions.TooManyRequestsException) as raised:
        client.invoke(FunctionName=THROTTLED, Payload=b"{}")

    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 429
    assert raised.value.response["Reason"] == "ReservedFunctionConcurrentInvocationLimitExceeded"


def test_each_invocation_is_recorded_in_the_activity_log_as_a_direct_one(lambda_api: Lambda) -> None:
    response = lambda_api.invoke(payload={"marker": "recorded"})

    recorded = lambda_api.activity.invocations("EchoFunction")[-1]
    assert (recorded.trigger, recorded.source, recorded.event) == ("direct", SOURCE, {"marker": "recorded"})
    assert recorded.result.request_id == response["ResponseMetadata"]["RequestId"]


def test_other_lambda_operations_are_not_served_and_no_template_route_may_take_the_prefix(
    lambda_api: Lambda,
) -> None:
    client = lambda_api.client
    route = ApiRoute(
        function="OrdersApiFunction",
        name="Clash",
        api="ServerlessRestApi",
        path="/2015-03-31/x",
        method="GET",
    )

    with pytest.raises(client.exceptions.ClientError, match="UnknownOperationException"):
        client.get_function(FunctionName=ECHO)
    with pytest.raises(RouteConflict, match="Lambda's Invoke API"):
        RouteTable([route], {})
