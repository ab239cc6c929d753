"""The template parameters the environment chooses for the local stack, as the Makefile passes them
(`make local ORDER_STORE=postgres`, `make invoke ... ORDER_STORE=postgres`): one reading for every
command that builds the template, and what a resource the chosen parameters leave out would need."""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping

from tools.template import Template

# Template parameters the environment may choose, by variable.
PARAMETER_VARIABLES = {"ORDER_STORE": "OrderStore", "POSTGRES_RELAY": "PostgresRelay"}


def chosen_parameters(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The parameters the environment sets (by parameter name), those it leaves unset left out."""
    environ = os.environ if environ is None else environ
    return {
        parameter: environ[variable]
        for variable, parameter in PARAMETER_VARIABLES.items()
        if environ.get(variable)
    }


def chosen_template(environ: Mapping[str, str] | None = None) -> Template:
    """template.yaml with the parameters the environment chooses (PARAMETER_VARIABLES); SystemExit naming
    the variable whose value the template does not allow."""
    template = Template.load()
    chosen = chosen_parameters(environ)
    for variable, parameter in PARAMETER_VARIABLES.items():
        value = chosen.get(parameter, template.parameter_values[parameter])
        allowed = template.data["Parameters"][parameter]["AllowedValues"]
        if value not in allowed:
            raise SystemExit(f"error: {variable} must be one of {', '.join(allowed)}, got {value!r}")
        template.parameter_values[parameter] = value
    return template


def needed_for(template: Template, logical_id: str) -> str | None:
    """What the environment must choose for `logical_id` to be created, as `VARIABLE=value ...` (the
    fewest changes to the template's current parameters); None when they create it already, or when no
    choice of these parameters does."""
    if template.is_created(logical_id):
        return None
    current = dict(template.parameter_values)
    variables = list(PARAMETER_VARIABLES.items())
    choices = [template.data["Parameters"][parameter]["AllowedValues"] for _, parameter in variables]
    creating: list[dict[str, str]] = []
    try:
        for values in itertools.product(*choices):
            changes = {
                variable: value
                for (variable, parameter), value in zip(variables, values, strict=True)
                if current[parameter] != value
            }
            template.parameter_values.update(
                {parameter: value for (_, parameter), value in zip(variables, values, strict=True)}
            )
            if template.is_created(logical_id):
                creating.append(changes)
    finally:
        template.parameter_values.clear()
        template.parameter_values.update(current)
    if not creating:
        return None
    fewest = min(creating, key=len)
    return " ".join(f"{variable}={value}" for variable, value in fewest.items())
