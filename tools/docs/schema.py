"""JSON Schema (draft-07, as AsyncAPI 3.0 schemas are) of the TypedDicts that declare event data.

A TypedDict becomes a closed object (`additionalProperties: false`: the document says exactly what the
code sends) registered under its class name, so nested declarations are `$ref`s to one definition.
`Annotated[T, Constraint(...)]` adds the constraint's keywords to T's schema.
"""

from __future__ import annotations

import types
import typing
from typing import Any, get_args, get_origin, get_type_hints, is_typeddict

from tools.docs.domain import Constraint

SCHEMAS_PATH = "#/components/schemas/"
_SCALARS: dict[object, str] = {str: "string", int: "integer", bool: "boolean", float: "number"}


def constraint_keywords(constraint: Constraint) -> dict[str, Any]:
    keywords: dict[str, Any] = {}
    if constraint.description is not None:
        keywords["description"] = constraint.description
    if constraint.enum:
        keywords["enum"] = list(constraint.enum)
    if constraint.pattern is not None:
        keywords["pattern"] = constraint.pattern
    if constraint.format is not None:
        keywords["format"] = constraint.format
    if constraint.minimum is not None:
        keywords["minimum"] = constraint.minimum
    if constraint.min_items is not None:
        keywords["minItems"] = constraint.min_items
    return keywords


class SchemaBuilder:
    """Builds schemas, collecting every TypedDict met on the way in `definitions` (name -> schema)."""

    def __init__(self) -> None:
        self.definitions: dict[str, dict[str, Any]] = {}

    def reference(self, typed_dict: type) -> dict[str, Any]:
        name = typed_dict.__name__
        if name not in self.definitions:
            self.definitions[name] = {}  # reserved first: a declaration may refer to itself
            self.definitions[name] = self.object_schema(typed_dict)
        return {"$ref": SCHEMAS_PATH + name}

    def object_schema(self, typed_dict: type) -> dict[str, Any]:
        hints = get_type_hints(typed_dict, include_extras=True)
        # __required_keys__ misses NotRequired in a module with postponed annotations (the class sees a
        # string); the evaluated hint still says it.
        required: frozenset[str] = frozenset(
            name
            for name in typed_dict.__required_keys__  # type: ignore[attr-defined]
            if get_origin(hints[name]) is not typing.NotRequired
        )
        schema: dict[str, Any] = {"type": "object"}
        doc = typed_dict.__dict__.get("__doc__")  # its own docstring, not dict's
        if doc:
            schema["description"] = " ".join(doc.split())
        schema["required"] = [name for name in hints if name in required]
        schema["additionalProperties"] = False
        schema["properties"] = {name: self.schema(hint) for name, hint in hints.items()}
        return schema

    def schema(self, hint: Any) -> dict[str, Any]:
        origin = get_origin(hint)
        if origin is typing.Annotated:
            base, *metadata = get_args(hint)
            schema = self.schema(base)
            for item in metadata:
                if isinstance(item, Constraint):
                    schema.update(constraint_keywords(item))
            return schema
        if origin in (typing.NotRequired, typing.Required):
            return self.schema(get_args(hint)[0])
        if hint in _SCALARS:
            return {"type": _SCALARS[hint]}
        if origin is list:
            [item] = get_args(hint)
            return {"type": "array", "items": self.schema(item)}
        if origin is dict:
            return {"type": "object"}
        if origin in (typing.Union, types.UnionType):
            return {"anyOf": [self.schema(arg) for arg in get_args(hint)]}
        if hint is type(None):
            return {"type": "null"}
        if isinstance(hint, type) and is_typeddict(hint):
            return self.reference(hint)
        raise TypeError(f"no JSON Schema for {hint!r}: declare event data with str, int, list and TypedDicts")
