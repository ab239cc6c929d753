"""A deploy that changes PostgresRelay, as CloudFormation runs it, on the local stack (relay_operations.py).

CloudFormation sends the custom resource OrderDatabaseSchema an Update with its new properties (RelayMode)
and waits for the answer PUT to the request's ResponseURL (here: the loopback server the local stack's
Create is answered to, custom_resources.ResponseServer, as CloudFormation's presigned S3 URL); on FAILED it
rolls the stack back, which sends the resource an Update back to the properties it had. The functions that
depend on OrderDatabaseSchema are updated after it (the publisher's DependsOn): `redeploy` gives them their
new configuration the way Lambda does with a new version (the execution environments running now finish
their invocation with the old one and are never used again). tools/local/services/custom_resources.py
sends the stack's Create the same way at start-up.
"""

from __future__ import annotations

import json
from typing import Any

from tools.local.runtime.functions import FunctionRuntime
from tools.local.services.custom_resources import ACCOUNT_STACK_ID
from tools.template import REGION, Template, TemplateError

SCHEMA_RESOURCE = "OrderDatabaseSchema"
RELAY_MODE = "RelayMode"  # the custom resource's property (!Ref PostgresRelay)
PHYSICAL_ID = "order-database-schema"  # what the migration function answered to the stack's Create


def redeploy(runtime: FunctionRuntime, environment: dict[str, str]) -> int:
    """A function's new configuration: new execution environments get `environment` on top of the old;
    the ones there now finish what they run with the old one and are never used again. Returns how many
    environments were retired. (The local runtime's pool is reached into on purpose: Lambda has no such
    call, a deploy publishes a new version.)"""
    condition = runtime._condition
    with condition:
        # An environment being launched reads the environment outside the lock: wait until none is, so
        # every one launched from now on has the new configuration and every one before it is retired.
        while runtime._starting:
            condition.wait(0.05)  # the pool does not always notify when a launch ends: look again
        runtime.environment.update(environment)
        retired = list(runtime._environments)
        idle = list(runtime._idle)
        runtime._idle = []
        for each in retired:
            each.discarded = True  # a busy one is disposed of when its invocation ends
        runtime._environments = [each for each in retired if each not in idle]
        condition.notify_all()
    for each in idle:
        runtime._dispose(each)
    return len(retired)


def update_request(
    template: Template, relay_from: str, relay_to: str, response_url: str, request_id: str
) -> dict[str, Any]:
    """CloudFormation's Update of OrderDatabaseSchema for a deploy that changes PostgresRelay (a
    SAM-only reference in its properties stays named, as at the stack's Create)."""
    properties: dict[str, Any] = {}
    for name, value in template.resources[SCHEMA_RESOURCE].get("Properties", {}).items():
        try:
            properties[name] = template.resolve(value)
        except TemplateError:
            properties[name] = json.dumps(value, sort_keys=True)
    return {
        "RequestType": "Update",
        "ResponseURL": response_url,
        "StackId": ACCOUNT_STACK_ID.format(region=REGION, stack=template.stack_name),
        "RequestId": request_id,
        "ResourceType": template.resources[SCHEMA_RESOURCE]["Type"],
        "LogicalResourceId": SCHEMA_RESOURCE,
        "PhysicalResourceId": PHYSICAL_ID,
        "ResourceProperties": {**properties, RELAY_MODE: relay_to},
        "OldResourceProperties": {**properties, RELAY_MODE: relay_from},
    }
