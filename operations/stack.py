"""What the operator commands read from a deployed stack: its outputs (the names of its tables, queues,
bus and functions) and the parameters its functions' configuration follows; with --local, the running
local stack's outputs instead (operations/local_stack.py). One DescribeStacks per stack and command."""

from __future__ import annotations

import argparse
import os
from typing import Any

import boto3
from botocore.exceptions import ClientError

from operations import local_stack
from shop.runtime.config import Settings

# The stack's parameters the commands must read as its functions do (template.yaml's Globals set these
# variables from them; tests/unit/test_recovery.py holds the two to each other). Read from the stack, not
# from the operator's shell: an event the stack accepts must not be called poison here.
STACK_SETTINGS = {"MaxEventBytes": "MAX_EVENT_BYTES", "OutboxTtlDays": "OUTBOX_TTL_DAYS"}
# The stack's outputs that name its outbox tables, which replay reads (template.yaml's OutboxTables: the
# orders' and the inventory's, whatever the OrderStore; tests/unit/test_recovery.py holds the two to each
# other). With OrderStore=postgres the orders' events are in the order database too.
OUTBOX_TABLE_OUTPUTS = ("OrdersTableName", "InventoryTableName")

_described: dict[str, dict[str, Any]] = {}  # by stack name, for the command that runs (forget_stacks)


def forget_stacks() -> None:
    """Describe the stacks again: a process (a test) may run several commands, on stacks that changed."""
    _described.clear()


def describe_stack(stack_name: str) -> dict[str, Any]:
    if stack_name in _described:
        return _described[stack_name]
    client = boto3.client("cloudformation")
    try:
        stack = client.describe_stacks(StackName=stack_name)["Stacks"][0]
    except ClientError as exc:
        # Named with its region: a stack looked for in another region than the one it is in does not exist.
        message = exc.response["Error"].get("Message", exc)
        raise SystemExit(
            f"error: stack {stack_name} in region {client.meta.region_name}: {message}"
        ) from None
    _described[stack_name] = dict(stack)
    return _described[stack_name]


def stack_outputs(stack_name: str) -> dict[str, str]:
    local = local_stack.outputs(stack_name)  # --local: the running local stack's, from its state file
    if local is not None:
        return local
    stack = describe_stack(stack_name)
    return {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}


def stack_output(stack_name: str, output: str) -> str:
    """One output of the stack; SystemExit naming it when the stack has none such."""
    found = stack_outputs(stack_name).get(output)
    if found is None:
        raise SystemExit(f"error: stack {stack_name} has no output {output}")
    return found


def settings_of(args: argparse.Namespace) -> Settings:
    """The configuration the stack's functions run with, as far as the commands need it: with
    --stack-name, the stack's own parameters (STACK_SETTINGS); otherwise (and with --local, whose
    environment carries them) this process's environment."""
    env = dict(os.environ)
    if args.stack_name and local_stack.outputs(args.stack_name) is None:
        parameters = describe_stack(args.stack_name).get("Parameters", [])
        values = {p["ParameterKey"]: p.get("ParameterValue") for p in parameters}
        env.update({var: str(values[name]) for name, var in STACK_SETTINGS.items() if values.get(name)})
    return Settings.from_env(env)
