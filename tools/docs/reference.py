"""The marked tables of docs/reference.md: resources by type with their purpose, outputs, permissions.

A resource's purpose is what the template says of it, first found of: `Metadata: Description` (the
convention for types that have no Description property), its `Description` or `AlarmDescription`,
the Description of the output that returns it; else what refers to it (the function that logs to a log
group, the queues a queue policy governs, the role a policy attaches to, the routes of an API). A
resource with none of these stops the generator: give it `Metadata: Description`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from tools.docs.cfn import WILDCARD, ExpandedTemplate, Grant, TemplateError, as_list, logical_id, reference


def ticked(names: Iterable[str]) -> str:
    return ", ".join(f"`{name}`" for name in names)


def cell(text: str) -> str:
    """Text fit for one Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# --- resources ------------------------------------------------------------------------------------
def _output_descriptions(template: ExpandedTemplate) -> dict[str, str]:
    """Resource -> the Description of the output that returns it (a Ref rather than an attribute)."""
    found: dict[str, str] = {}
    for output in template.outputs.values():
        named = reference(output.get("Value"))
        description = output.get("Description")
        if named is None or not description:
            continue
        if "." not in named or logical_id(named) not in found:
            found[logical_id(named)] = str(description)
    return found


def _referrers(template: ExpandedTemplate) -> dict[str, str]:
    """Resource -> its purpose as told by what refers to it."""
    told: dict[str, str] = {}
    routes: dict[str, list[str]] = defaultdict(list)
    for function in template.functions():
        props = template.properties(function)
        log_group = reference(props.get("LoggingConfig", {}).get("LogGroup"))
        if log_group:
            told[log_group] = f"Log group of `{function}`."
        for event in props.get("Events", {}).values():
            source = event.get("Properties", {})
            api = reference(source.get("RestApiId"))
            if event["Type"] == "Api" and api:
                routes[api].append(f"`{source['Method'].upper()} {source['Path']}` → `{function}`")
    for api, served in routes.items():
        told[api] = "REST API: " + ", ".join(served) + "."
    for name, resource in template.resources.items():
        props = resource.get("Properties", {})
        kind = resource["Type"]
        if kind in ("AWS::SQS::QueuePolicy", "AWS::SNS::TopicPolicy"):
            governed = [reference(q) for q in as_list(props.get("Queues", props.get("Topics", [])))]
            told[name] = f"Who may send to {ticked(q for q in governed if q)}."
        elif kind in ("AWS::IAM::RolePolicy", "AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
            roles = [reference(r) for r in as_list(props.get("RoleName", props.get("Roles", [])))]
            told[name] = f"Permissions of {ticked(r for r in roles if r)}."
        elif kind == "AWS::SNS::Subscription":
            # The expansion empties the references of a resource whose condition is false: read the source.
            written = template.raw.get("Resources", {}).get(name, {}).get("Properties", {})
            topic = reference(props.get("TopicArn", written.get("TopicArn")))
            protocol = props.get("Protocol", written.get("Protocol", ""))
            told[name] = (
                f"Subscription ({protocol}) to `{topic}`." if topic else f"Subscription ({protocol})."
            )
    return told


def purposes(template: ExpandedTemplate) -> dict[str, str]:
    outputs = _output_descriptions(template)
    referrers = _referrers(template)
    found: dict[str, str] = {}
    for name, resource in template.resources.items():
        props = resource.get("Properties", {})
        purpose = (
            resource.get("Metadata", {}).get("Description")
            or props.get("Description")
            or props.get("AlarmDescription")
            or outputs.get(name)
            or referrers.get(name)
        )
        if not purpose:
            raise TemplateError(f"{name}: say what it is for in `Metadata: Description`")
        condition = resource.get("Condition")
        found[name] = f"{str(purpose).rstrip('.')} (only when `{condition}`)." if condition else str(purpose)
    return found


def resources_table(template: ExpandedTemplate) -> str:
    purpose = purposes(template)
    ordered = sorted(template.resources.items(), key=lambda item: (item[1]["Type"], item[0]))
    rows = [[f"`{name}`", f"`{r['Type']}`: {cell(purpose[name])}"] for name, r in ordered]
    return table(["Logical ID", "Type: what it is for"], rows)


# --- outputs ---------------------------------------------------------------------------------------
def returned(value: Any) -> str:
    """An output's Value as the template writes it: Ref `X`, GetAtt `X.Attribute`, Sub `...`."""
    if isinstance(value, dict) and len(value) == 1:
        [(function, argument)] = value.items()
        if function == "Fn::GetAtt":
            argument = ".".join(argument) if isinstance(argument, list) else argument
        if isinstance(argument, str):
            return f"{function.removeprefix('Fn::')} `{argument}`"
    if isinstance(value, str):
        return f"`{value}`"
    raise TemplateError(f"output value {value!r}: use Ref, GetAtt or Sub")


def outputs_table(template: ExpandedTemplate) -> str:
    rows = []
    for name, output in template.outputs.items():
        description = output.get("Description")
        if not description:
            raise TemplateError(f"output {name}: give it a Description")
        rows.append([f"`{name}`", cell(str(description)), cell(returned(output.get("Value")))])
    return table(["Output", "What", "Value"], rows)


# --- permissions -----------------------------------------------------------------------------------
def _resource_order(resource: str) -> tuple[bool, str]:
    return (resource == WILDCARD, resource)


def clauses(grants: frozenset[Grant]) -> str:
    """`a:X`, `a:Y` on `R1`, `R2`; `a:Z` on `*`: resources allowed the same actions share a clause.

    The grouping depends on the grants alone, so a role reads the same however its statements are
    split between inline policies and policy resources.
    """
    actions_on: dict[str, set[str]] = defaultdict(set)
    for action, resource in grants:
        actions_on[resource].add(action)
    resources_with: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for resource in sorted(actions_on, key=_resource_order):
        resources_with[tuple(sorted(actions_on[resource]))].append(resource)
    return "; ".join(
        f"{ticked(actions)} on {ticked(resources)}" for actions, resources in resources_with.items()
    )


def permissions_table(template: ExpandedTemplate) -> str:
    rows = []
    for function in template.functions():
        permissions = template.permissions(function)
        rows.append(
            [
                f"`{function}` (role `{permissions.role}`)",
                clauses(permissions.code),
                clauses(permissions.runtime),
            ]
        )
    return table(["Function", "Its code calls", "Lambda uses, to run it"], rows)


def tables(template: ExpandedTemplate) -> dict[str, str]:
    """Marker name -> the table between `<!-- name:start -->` and `<!-- name:end -->`."""
    return {
        "resources": resources_table(template),
        "outputs": outputs_table(template),
        "permissions": permissions_table(template),
    }
