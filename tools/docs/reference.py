"""The marked tables of docs/reference.md: resources by type with their purpose, outputs, permissions.

A resource's purpose is what the template says of it, first found of: `Metadata: Description` (the
convention for types that have no Description property), its `Description` or `AlarmDescription`,
the Description of the output that returns it; else what refers to it (the function that logs to a log
group, the queues a queue policy governs, the role a policy attaches to, the routes of an API). A
resource with none of these stops the generator: give it `Metadata: Description`.

The template is read for each value of its variant parameter (cfn.VARIANT_PARAMETER, OrderStore): a
resource or output is described as the expansion in which it is created reads it, and each function's
permissions are listed per value, one row for the values that grant it the same.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from tools.docs.cfn import (
    VARIANT_PARAMETER,
    WILDCARD,
    ExpandedTemplate,
    Grant,
    Permissions,
    TemplateError,
    as_list,
    logical_id,
    reference,
)


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


def where_created(template: ExpandedTemplate, name: str, section: str = "Resources") -> ExpandedTemplate:
    """The first expansion (of template.variants()) that creates the resource or output; the default if
    none does (its condition is on another parameter, such as HasAlarmEmail)."""
    variants = list(template.variants().values())
    for variant in variants:
        condition = variant.data.get(section, {})[name].get("Condition")
        if condition is None or variant.conditions[condition]:
            return variant
    return variants[0]


def purposes(template: ExpandedTemplate) -> dict[str, str]:
    """Each resource's purpose, from the expansion that creates it (another one empties its references)."""
    told = {
        id(variant): (_output_descriptions(variant), _referrers(variant))
        for variant in template.variants().values()
    }
    found: dict[str, str] = {}
    for name in template.resources:
        variant = where_created(template, name)
        outputs, referrers = told[id(variant)]
        resource = variant.resources[name]
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
        found[name] = only_when(str(purpose), resource.get("Condition"))
    return found


def only_when(text: str, condition: str | None) -> str:
    return f"{' '.join(text.split()).rstrip('.')} (only when `{condition}`)." if condition else text


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
    for name in template.outputs:
        output = where_created(template, name, "Outputs").outputs[name]
        description = output.get("Description")
        if not description:
            raise TemplateError(f"output {name}: give it a Description")
        what = only_when(str(description), output.get("Condition"))
        rows.append([f"`{name}`", cell(what), cell(returned(output.get("Value")))])
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
    """One row per function and set of variant values that grant it the same (values it is not created
    for have none)."""
    variants = template.variants()
    functions = {f: None for variant in variants.values() for f in variant.functions()}
    rows = []
    for function in functions:
        granting: dict[Permissions, list[str]] = defaultdict(list)
        for value, variant in variants.items():
            if function in variant.functions():
                granting[variant.permissions(function)].append(value)
        for permissions, values in granting.items():
            row = [
                f"`{function}` (role `{permissions.role}`)",
                clauses(permissions.code),
                clauses(permissions.runtime),
            ]
            if len(variants) > 1:
                row.insert(1, ticked(values))
            rows.append(row)
    header = ["Function", "Its code calls", "Lambda uses, to run it"]
    if len(variants) > 1:
        header.insert(1, f"`{VARIANT_PARAMETER}`")
    return table(header, rows)


def tables(template: ExpandedTemplate) -> dict[str, str]:
    """Marker name -> the table between `<!-- name:start -->` and `<!-- name:end -->`."""
    return {
        "resources": resources_table(template),
        "outputs": outputs_table(template),
        "permissions": permissions_table(template),
    }
