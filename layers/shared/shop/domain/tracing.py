"""Trace context carried with each event: the X-Ray trace header AWS services pass along, and the W3C
`traceparent` it maps to, which the CloudEvents distributed-tracing extension puts in the envelope for
consumers outside AWS.

X-Ray's header (X-Ray developer guide, "Tracing header"): `Root=1-<8 hex: epoch seconds>-<24 hex>;
Parent=<16 hex>;Sampled=<0|1>`. Its trace id is the W3C trace id with the version and dashes removed
(X-Ray accepts W3C trace ids: the 32 hex digits, the first 8 the start time); the parent segment id is
the W3C parent id. `traceparent` (W3C Trace Context): `00-<32 hex trace id>-<16 hex parent id>-<2 hex
flags>`, flag 01 = sampled.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NamedTuple

# Asked at each outbox write for the X-Ray trace header the write carries (None: no trace); any store's
# repository takes one.
TraceHeaderSource = Callable[[], str | None]


def no_trace_header() -> str | None:
    """For writers outside Lambda (tools, tests): no invocation, so no trace to carry."""
    return None


_ROOT = re.compile(r"^1-([0-9a-f]{8})-([0-9a-f]{24})$")
_HEX16 = re.compile(r"^[0-9a-f]{16}$")
_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


class TraceContext(NamedTuple):
    """A trace context: the trace, the span a next hop is a child of, and whether it is sampled."""

    trace_id: str  # 32 hex digits
    parent_id: str  # 16 hex digits: the span (X-Ray segment) the next hop is a child of
    sampled: bool

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.parent_id}-{'01' if self.sampled else '00'}"

    @property
    def xray_root(self) -> str:
        return f"1-{self.trace_id[:8]}-{self.trace_id[8:]}"

    @property
    def xray_header(self) -> str:
        return f"Root={self.xray_root};Parent={self.parent_id};Sampled={1 if self.sampled else 0}"


# A traceparent as long as any (every version-00 traceparent is 55 characters): what an event is measured
# with when a writer may still add its trace (shop.domain.envelope.with_room_for_a_trace).
LONGEST_TRACEPARENT = TraceContext("f" * 32, "f" * 16, sampled=True).traceparent


def from_xray_header(header: str | None) -> TraceContext | None:
    """The trace context of an X-Ray trace header; None when it has no valid Root and Parent (then there
    is nothing a next hop could be a child of)."""
    if not header:
        return None
    fields = dict(part.split("=", 1) for part in header.split(";") if "=" in part)
    root = _ROOT.match(fields.get("Root", "").lower())
    parent = fields.get("Parent", "").lower()
    if root is None or not _HEX16.match(parent) or parent == "0" * 16:
        return None
    return TraceContext(root.group(1) + root.group(2), parent, fields.get("Sampled") == "1")


def from_traceparent(value: str | None) -> TraceContext | None:
    """A W3C traceparent of version 00; None when malformed or all-zero (invalid by the spec)."""
    found = _TRACEPARENT.match(value or "")
    if found is None or found.group(1) == "0" * 32 or found.group(2) == "0" * 16:
        return None
    return TraceContext(found.group(1), found.group(2), int(found.group(3), 16) & 1 == 1)
