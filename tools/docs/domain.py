"""The one module of tools.docs that imports the domain package (`shop`): update it when shop moves."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository (tools/docs/domain.py)

# `python -m tools.docs` from the repository finds the layer as Lambda does (pytest and the Makefile
# put it on the path themselves).
_LAYER = str(ROOT / "layers" / "shared")
if _LAYER not in sys.path:
    sys.path.append(_LAYER)

from shop.domain.envelope import CONTENT_TYPE, SPEC_VERSION, CloudEvent  # noqa: E402
from shop.domain.event_types import EVENT_TYPES, Constraint, EventType  # noqa: E402

__all__ = ["CONTENT_TYPE", "EVENT_TYPES", "ROOT", "SPEC_VERSION", "CloudEvent", "Constraint", "EventType"]
