"""The OpenAPI document of the order API: generated from the Powertools resolver, completed with what the
resolver cannot know (the documented statuses, the error body, the order representation, the headers).

`python -m tools.chaos openapi` rewrites openapi.json (beside this file); a test checks that the committed
document is what this module generates and that its operations are exactly the routes of template.yaml.
The fuzzer (tools/chaos/fuzz.py) reads the committed document.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

from tools.local.reader.template import ROOT, Template

DOCUMENT = Path(__file__).with_name("openapi.json")
FUNCTION = "OrdersApiFunction"
TITLE = "Orders API"
VERSION = "1.0.0"

_ERROR = {"$ref": "#/components/schemas/ErrorBody"}
_ORDER = {"$ref": "#/components/schemas/Order"}
_CORRELATION_HEADER = {
    "X-Correlation-Id": {
        "description": "The caller's X-Correlation-Id when well-formed, else the request id",
        "schema": {"type": "string"},
    }
}

COMPONENTS: dict[str, Any] = {
    "ErrorBody": {
        "type": "object",
        "required": ["error"],
        "additionalProperties": False,
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message", "details"],
                "additionalProperties": False,
                "properties": {
                    "code": {"type": "string", "pattern": "^[A-Z][A-Z_]*$"},
                    "message": {"type": "string"},
                    "details": {"type": "object"},
                },
            }
        },
    },
    "OrderLine": {
        "type": "object",
        "required": ["sku", "quantity", "unitPrice", "lineTotal"],
        "additionalProperties": False,
        "properties": {
            "sku": {"type": "string"},
            "quantity": {"type": "integer", "minimum": 1},
            "unitPrice": {"type": "integer", "minimum": 0},
            "lineTotal": {"type": "integer", "minimum": 0},
        },
    },
    "Order": {
        "type": "object",
        "required": [
            "orderId",
            "customerId",
            "currency",
            "items",
            "totalAmount",
            "status",
            "version",
            "createdAt",
            "updatedAt",
        ],
        "additionalProperties": False,
        "properties": {
            "orderId": {"type": "string"},
            "customerId": {"type": "string"},
            "currency": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "items": {"type": "array", "minItems": 1, "items": {"$ref": "#/components/schemas/OrderLine"}},
            "totalAmount": {"type": "integer", "minimum": 0, "description": "minor units of the currency"},
            "status": {"type": "string", "enum": ["PENDING", "CONFIRMED", "REJECTED", "CANCELLED"]},
            "version": {"type": "integer", "minimum": 1},
            "createdAt": {"type": "string", "format": "date-time"},
            "updatedAt": {"type": "string", "format": "date-time"},
        },
    },
}


def _error(description: str, extra_headers: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "description": description,
        "headers": {**_CORRELATION_HEADER, **(extra_headers or {})},
        "content": {"application/json": {"schema": _ERROR}},
    }


def _order(description: str, extra_headers: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "description": description,
        "headers": {**_CORRELATION_HEADER, **(extra_headers or {})},
        "content": {"application/json": {"schema": _ORDER}},
    }


_RETRY_AFTER = {"Retry-After": {"description": "seconds to wait", "schema": {"type": "string"}}}
_INVALID_ID = "VALIDATION_FAILED: the order id is longer than 64 characters"

# The statuses of docs/api.md, per operation (method, resource path).
RESPONSES: dict[tuple[str, str], dict[str, Any]] = {
    ("post", "/orders"): {
        "201": _order(
            "Created (or, with a reused Idempotency-Key and the same body, the original answer replayed)",
            {
                "Location": {"description": "the order's URL", "schema": {"type": "string"}},
                "Idempotent-Replayed": {"description": "true on a replay", "schema": {"type": "string"}},
            },
        ),
        "400": _error("MALFORMED_JSON, INVALID_HEADER (Idempotency-Key)"),
        "409": _error("REQUEST_IN_PROGRESS: the same Idempotency-Key is being committed; retry"),
        "413": _error("BODY_TOO_LARGE, EVENT_TOO_LARGE"),
        "415": _error("UNSUPPORTED_MEDIA_TYPE: send application/json"),
        "422": _error("VALIDATION_FAILED, IDEMPOTENCY_KEY_REUSED"),
        "503": _error("SERVICE_BUSY: the order store throttled the write; retry", _RETRY_AFTER),
    },
    ("get", "/orders/{orderId}"): {
        "200": _order("The order"),
        "404": _error("ORDER_NOT_FOUND"),
        "422": _error(_INVALID_ID),
    },
    ("post", "/orders/{orderId}/cancel"): {
        "200": _order("The order, CANCELLED (cancelling a cancelled order changes nothing)"),
        "404": _error("ORDER_NOT_FOUND"),
        "409": _error("ILLEGAL_TRANSITION (a REJECTED order), CONCURRENT_MODIFICATION"),
        "422": _error(_INVALID_ID),
        "503": _error("SERVICE_BUSY: the order store throttled the write; retry", _RETRY_AFTER),
    },
}
HEADER_PARAMETERS: dict[tuple[str, str], list[dict[str, Any]]] = {
    ("post", "/orders"): [
        {
            "name": "Idempotency-Key",
            "in": "header",
            "required": False,
            "description": "A unique key (a UUID) per order: a retry with the same key and body is replayed",
            "schema": {"type": "string", "pattern": "^[\\x21-\\x7e]{1,255}$"},
        }
    ],
}
_CORRELATION_PARAMETER = {
    "name": "X-Correlation-Id",
    "in": "header",
    "required": False,
    "description": "Carried in every event of the saga; a malformed one is replaced by the request id",
    "schema": {"type": "string"},
}


def _load_resolver() -> Any:
    """The API function's Powertools resolver, imported from its CodeUri as Lambda would."""
    spec = Template.load().function(FUNCTION)
    module_file, _ = spec.handler.rsplit(".", 1)
    for directory in (*spec.layer_dirs, spec.code_uri):
        if str(directory) not in sys.path:
            sys.path.insert(0, str(directory))
    os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")
    name = f"chaos_openapi_{FUNCTION}"
    if name not in sys.modules:
        module_spec = importlib.util.spec_from_file_location(name, spec.code_uri / f"{module_file}.py")
        if module_spec is None or module_spec.loader is None:
            raise ImportError(f"cannot load the handler of {FUNCTION} from {spec.code_uri}")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
    return sys.modules[name].app


def _integral_bounds(node: Any) -> Any:
    """Pydantic writes integer bounds as floats (10000.0); the API takes integers only, so say integers."""
    if isinstance(node, dict):
        return {
            k: int(v) if isinstance(v, float) and v.is_integer() and k in _BOUNDS else _integral_bounds(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_integral_bounds(v) for v in node]
    return node


_BOUNDS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})


def generate() -> dict[str, Any]:
    resolver = _load_resolver()
    document: dict[str, Any] = json.loads(resolver.get_openapi_json_schema(title=TITLE, version=VERSION))
    document["info"]["description"] = (
        "The order API of the transactional outbox reference (docs/api.md). Generated by "
        "tools/chaos/openapi.py from the Powertools resolver and completed with the documented statuses "
        "and error body."
    )
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            key = (method, path)
            if key not in RESPONSES:
                raise ValueError(f"{method.upper()} {path} is a route without documented responses")
            operation["responses"] = copy.deepcopy(RESPONSES[key])
            parameters = operation.setdefault("parameters", [])
            parameters.extend(copy.deepcopy(HEADER_PARAMETERS.get(key, [])))
            parameters.append(copy.deepcopy(_CORRELATION_PARAMETER))
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError", "ResponseValidationError"):
        schemas.pop(unused, None)
    schemas.update(copy.deepcopy(COMPONENTS))
    return dict(_integral_bounds(document))


def render(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


def committed() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DOCUMENT.read_text())
    return loaded


def write() -> Path:
    DOCUMENT.write_text(render(generate()))
    return DOCUMENT


def relative(path: Path) -> str:
    return str(path.relative_to(ROOT))
