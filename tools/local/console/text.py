"""Record contents as text a terminal can show: whatever an outbox or a queue holds, never an exception.

Records carry anything a writer put there: text that is not JSON, JSON nested deeper than Python's
recursion limit, integers longer than the 4,300 digits Python converts to and from text by default
(sys.set_int_max_str_digits: json.loads and str() raise ValueError past it), lone surrogates (a JSON
`\\ud800` escape decodes to one, and no UTF-8 stream can write it), bytes that are not UTF-8, control
characters (an escape sequence would drive the terminal). Parsing keeps such integers as a description
instead of raising, and every value shown is bounded and escaped: the limit stays Python's default,
since raising it for the whole process would let any record cost quadratic time to print.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

MAX_PART_CHARS = 80
_MAX_JSON_CHARS = 1 << 20  # 1 MiB: an outbox item holds at most 400 KB, a queue message 256 KiB
# C0 and C1 controls (escape sequences, carriage returns) and the bidirectional overrides that reorder
# what follows them on screen.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


class LongInteger(str):
    """A JSON integer longer than Python converts (sys.get_int_max_str_digits), kept as a description."""

    __slots__ = ()


def _integer(digits: str) -> int | LongInteger:
    limit = sys.get_int_max_str_digits()
    if limit and len(digits.lstrip("-")) > limit:
        return LongInteger(f"{digits[:12]}…({len(digits.lstrip('-'))} digits)")
    return int(digits)


def json_value(text: Any) -> Any:
    """The JSON text's value, or None when it is not JSON (or too large or too deep to read)."""
    if isinstance(text, bytes | bytearray):
        try:
            text = bytes(text).decode()
        except UnicodeDecodeError:
            return None
    if not isinstance(text, str) or len(text) > _MAX_JSON_CHARS:
        return None
    try:
        return json.loads(text, parse_int=_integer)
    except (ValueError, RecursionError):
        return None


def json_object(text: Any) -> dict[str, Any] | None:
    """json_value when it is an object."""
    if isinstance(text, str) and not text.lstrip().startswith("{"):
        return None  # cheap: most bodies that are not objects need no parse
    value = json_value(text)
    return value if isinstance(value, dict) else None


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def encodable(text: str, encoding: str = "utf-8") -> str:
    """The text with what `encoding` cannot encode (a lone surrogate, in UTF-8) as backslash escapes."""
    try:
        return text.encode(encoding, "backslashreplace").decode(encoding)
    except LookupError:  # an encoding Python does not know
        return text.encode("ascii", "backslashreplace").decode("ascii")


def printable(text: str, limit: int | None = None) -> str:
    """Text from a record, safe on a terminal: controls and lone surrogates escaped, cut at `limit`."""
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return encodable(_UNPRINTABLE.sub(_escape, text))


def shown(value: Any, limit: int = MAX_PART_CHARS) -> str:
    """A value from a record as one bounded, printable piece of a line."""
    if isinstance(value, str):
        return printable(value, limit)
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        if value.bit_length() > 64:  # str() of a long one raises past the digit limit, and costs
            return f"(an integer of {value.bit_length()} bits)"
        return str(value)
    if isinstance(value, bytes | bytearray):
        return printable(bytes(value[:limit]).decode("utf-8", "backslashreplace"), limit)
    if isinstance(value, dict | list | tuple | set):
        return f"({type(value).__name__} of {len(value)})"
    try:
        return printable(str(value), limit)
    except Exception as exc:  # noqa: BLE001 - a value's own __str__ may raise anything
        return f"({type(value).__name__} that cannot be shown: {type(exc).__name__})"
