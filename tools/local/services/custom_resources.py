"""CloudFormation custom resources (Custom::*, AWS::CloudFormation::CustomResource) backed by a function of
the template: created at start-up the way CloudFormation creates them, so the deploy-time step (the order
database's migrations: OrderDatabaseSchema) runs locally through the same handler.

What CloudFormation documents, and this encodes ("Custom resources" and "Custom resource request/response
objects" in the CloudFormation user guide, crpg-ref-requests.html / crpg-ref-responses.html): it sends the
function a request with RequestType Create, ResponseURL, StackId, RequestId, ResourceType,
LogicalResourceId and ResourceProperties (ServiceToken included), and waits for the function to PUT a JSON
response with Status SUCCESS or FAILED (and Reason) to ResponseURL; a FAILED status fails the stack.
Locally ResponseURL is a loopback HTTP endpoint of this module; the stack does not start when a custom
resource fails or never answers within the function's timeout.
"""

from __future__ import annotations

import json
import queue
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tools.local.processes import LOOPBACK, StartupError
from tools.local.runtime.functions import FunctionRuntime
from tools.template import REGION, Template, TemplateError

ACCOUNT_STACK_ID = "arn:aws:cloudformation:{region}:000000000000:stack/{stack}/local"
CUSTOM_RESOURCE_TYPES = ("AWS::CloudFormation::CustomResource",)


def custom_resources(template: Template) -> list[str]:
    return [
        logical_id
        for logical_id, resource in template.resources.items()
        if (resource["Type"].startswith("Custom::") or resource["Type"] in CUSTOM_RESOURCE_TYPES)
        and template.is_created(logical_id)
    ]


def service_function(template: Template, logical_id: str) -> str:
    """The template function behind a custom resource's ServiceToken (its ARN, alias or Ref)."""
    token = template.resources[logical_id].get("Properties", {}).get("ServiceToken")
    target = None
    if isinstance(token, dict):
        raw = token.get("Ref") or (token.get("Fn::GetAtt") or [None])[0]
        target = str(raw).split(".")[0] if raw else None  # Ref: Function.Alias (SAM) names the function
    if target is None or template.resources.get(target, {}).get("Type") != "AWS::Serverless::Function":
        raise TemplateError(f"{logical_id}: ServiceToken {token!r} is not a function of this template")
    return target


class ResponseServer(ThreadingHTTPServer):
    """Where custom resources PUT their responses (each request's ResponseURL, as CloudFormation's
    presigned S3 URL), by request id: a loopback server, serving from a thread of its own until close()."""

    daemon_threads = True

    def __init__(self, thread_name: str) -> None:
        super().__init__((LOOPBACK, 0), _ResponseHandler)
        self.received: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        threading.Thread(target=self.serve_forever, name=thread_name, daemon=True).start()

    def url(self, request_id: str) -> str:
        return f"http://{LOOPBACK}:{self.server_address[1]}/{request_id}"

    def response(self, request_id: str, timeout: float) -> dict[str, Any] | None:
        """The response to `request_id` (None: none within `timeout`); responses to others are dropped."""
        try:
            while True:
                answered_id, response = self.received.get(timeout=timeout)
                if answered_id == request_id:
                    return response
        except queue.Empty:
            return None

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class _ResponseHandler(BaseHTTPRequestHandler):
    server: ResponseServer

    def do_PUT(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            response = json.loads(body)
        except ValueError:
            response = {"Status": "FAILED", "Reason": f"response is not JSON: {body[:200]!r}"}
        self.server.received.put((self.path.lstrip("/"), response))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        pass  # not the console's business


def create_custom_resources(template: Template, functions: dict[str, FunctionRuntime]) -> dict[str, Any]:
    """Send each custom resource its Create request; returns each one's response Data."""
    created: dict[str, Any] = {}
    names = custom_resources(template)
    if not names:
        return created
    server = ResponseServer("custom-resource-responses")
    try:
        for logical_id in names:
            created[logical_id] = _create(template, logical_id, functions, server)
    finally:
        server.close()
    return created


def _create(
    template: Template, logical_id: str, functions: dict[str, FunctionRuntime], server: ResponseServer
) -> Any:
    function = service_function(template, logical_id)
    if function not in functions:
        raise StartupError(f"custom resource {logical_id}: its function {function} is not running")
    request_id = str(uuid.uuid4())
    properties = {
        name: _resolved(template, value)
        for name, value in template.resources[logical_id].get("Properties", {}).items()
    }
    event = {
        "RequestType": "Create",
        "ResponseURL": server.url(request_id),
        "StackId": ACCOUNT_STACK_ID.format(region=REGION, stack=template.stack_name),
        "RequestId": request_id,
        "ResourceType": template.resources[logical_id]["Type"],
        "LogicalResourceId": logical_id,
        "ResourceProperties": properties,
    }
    result = functions[function].invoke(event)
    if not result.ok:
        raise StartupError(f"custom resource {logical_id}: {function} failed: {result.error}")
    try:
        answered_id, response = server.received.get(timeout=1.0)  # the PUT came before the return
    except queue.Empty:
        raise StartupError(f"custom resource {logical_id}: {function} returned without answering") from None
    if answered_id != request_id or response.get("Status") != "SUCCESS":
        raise StartupError(f"custom resource {logical_id} FAILED: {response.get('Reason', response)}")
    return response.get("Data", {})


def _resolved(template: Template, value: Any) -> Any:
    """A property as CloudFormation would pass it; SAM-only references (Function.Version) stay named."""
    try:
        return template.resolve(value)
    except TemplateError:
        return json.dumps(value, sort_keys=True)
