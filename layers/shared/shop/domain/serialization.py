"""Dataclasses as the JSON documents the product and its tools print: each field under its camelCase name.

A report's keys are its dataclass's fields, in the order they are declared, named in camelCase (`dry_run`
is `dryRun`); what a class computes (a `complete` property, a time in milliseconds) it adds itself. The
values are the fields' own, not copies: a list is the report's list, a nested dataclass is left as it is
(dataclasses.asdict copies deeply, turns nested dataclasses into dicts and keeps the snake_case names).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import Field, fields
from typing import Any, ClassVar, Protocol


class Dataclass(Protocol):
    """An instance of any dataclass."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]


def camel_case(name: str) -> str:
    """`dead_letter_for` is `deadLetterFor`."""
    first, *rest = name.split("_")
    return first + "".join(word.capitalize() for word in rest)


def camel_fields(instance: Dataclass, *, omit: Collection[str] = ()) -> dict[str, Any]:
    """The instance's fields in declaration order under their camelCase names, less those `omit` names
    (by field name: one that is not a field is a mistake, and raises ValueError)."""
    names = [f.name for f in fields(instance)]
    unknown = set(omit).difference(names)
    if unknown:
        raise ValueError(f"{type(instance).__name__} has no fields {sorted(unknown)}")
    return {camel_case(name): getattr(instance, name) for name in names if name not in omit}
