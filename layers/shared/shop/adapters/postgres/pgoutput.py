"""Decoding the messages of PostgreSQL's built-in `pgoutput` plugin (logical replication protocol
version 1), as pg_logical_slot_peek_binary_changes() returns them: one message per row.

Written here, not taken from a library: the maintained pure-Python decoder (`pgoutput` on PyPI) is not
in this project's registry; `pypgoutput` is a prototype tied to psycopg2 and pydantic; `pgoutput-decoder`
owns its own connection (Rust, no arm64 Lambda wheel). The relay needs six messages of one protocol
version, each laid out in "Logical Replication Message Formats" (PostgreSQL docs, protocol-logicalrep-
message-formats): Begin, Commit, Relation, Insert, Message (it carries replay requests), and the ones it
must skip safely (Origin, Type, Update, Delete, Truncate). tests/unit/test_pgoutput.py builds each from
that page's layout; tests/unit/test_logical_relay.py decodes what a real server sends.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

POSTGRES_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)  # protocol timestamps: microseconds since this


class DecodingError(ValueError):
    """Bytes that are not a pgoutput v1 message this decoder knows."""


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int  # the commit record's LSN
    commit_time: datetime
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    commit_lsn: int
    end_lsn: int  # the end of the commit record: where a consumer that has it all confirms to
    commit_time: datetime


@dataclass(frozen=True, slots=True)
class Relation:
    relation_id: int
    namespace: str
    name: str
    columns: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Insert:
    relation_id: int
    # Column values in text form, None for NULL (pgoutput sends text unless the `binary` option is on).
    values: tuple[str | None, ...]


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    """pg_logical_emit_message()'s message (sent when the `messages` option is on)."""

    transactional: bool
    lsn: int
    prefix: str
    content: bytes


@dataclass(frozen=True, slots=True)
class Skipped:
    """A message the outbox relay has no use for (its kind byte, for logs and tests)."""

    kind: str


Message = Begin | Commit | Relation | Insert | LogicalMessage | Skipped

# Kinds a version 1 stream may hold that the relay ignores: Origin, Type, Update, Delete, Truncate.
_SKIPPED_KINDS = frozenset(b"OYUDT")


# Precompiled layouts (network byte order): struct.Struct.unpack_from reads in place, without a slice or a
# format parse per field; a relay decodes a Begin, an Insert and a Commit per outbox event.
_INT8, _INT16, _INT32, _INT64 = (struct.Struct(layout) for layout in ("!b", "!h", "!i", "!q"))
_BEGIN = struct.Struct("!qqI")  # the xid is a TransactionId: unsigned
_COMMIT = struct.Struct("!bqqq")  # flags (currently unused), commit LSN, end LSN, commit timestamp
_TYPE_OID_AND_MODIFIER = struct.Struct("!ii")
_MESSAGE_HEADER = struct.Struct("!bq")  # flags, LSN


class _Reader:
    __slots__ = ("_data", "_end", "_offset")

    def __init__(self, data: bytes, offset: int) -> None:
        self._data = data
        self._end = len(data)
        self._offset = offset

    def _advance(self, size: int) -> int:
        """The offset of the next `size` bytes, which are then taken."""
        start = self._offset
        end = start + size
        if size < 0:  # a length field read as a negative Int32
            raise DecodingError(f"negative length {size}")
        if end > self._end:
            raise DecodingError(f"message truncated: needs {end} bytes, has {self._end}")
        self._offset = end
        return start

    def fixed(self, layout: struct.Struct) -> tuple[int, ...]:
        return layout.unpack_from(self._data, self._advance(layout.size))

    def take(self, size: int) -> bytes:
        start = self._advance(size)
        return self._data[start : start + size]

    def int8(self) -> int:
        return self.fixed(_INT8)[0]

    def int16(self) -> int:
        return self.fixed(_INT16)[0]

    def int32(self) -> int:
        return self.fixed(_INT32)[0]

    def string(self) -> str:
        end = self._data.find(b"\x00", self._offset)
        if end < 0:
            raise DecodingError("unterminated string")
        text = self._data[self._offset : end].decode()
        self._offset = end + 1
        return text

    def tuple_data(self) -> tuple[str | None, ...]:
        """TupleData of an insert: text values, None for NULL."""
        data, end = self._data, self._end
        values: list[str | None] = []
        for _ in range(self.int16()):
            offset = self._offset
            if offset >= end:
                raise DecodingError(f"message truncated: needs {offset + 1} bytes, has {end}")
            form = data[offset]
            if form == _NULL:
                self._offset = offset + 1
                values.append(None)
            elif form == _TEXT:
                self._offset = offset + 1
                size = self.int32()
                start = self._advance(size)
                values.append(data[start : start + size].decode())
            else:  # 'u' (an unchanged TOASTed value) never occurs in an insert; 'b' needs the binary option
                raise DecodingError(f"unexpected column form {bytes([form])!r} in an insert")
        return tuple(values)

    def ensure_consumed(self, kind: str) -> None:
        if self._offset != self._end:
            raise DecodingError(f"{kind}: {self._end - self._offset} bytes left over")


_NULL, _TEXT = ord("n"), ord("t")


def _time(micros: int) -> datetime:
    return POSTGRES_EPOCH + timedelta(microseconds=micros)


def decode_message(data: bytes) -> Message:
    """One pgoutput v1 message."""
    if not data:
        raise DecodingError("empty message")
    kind, reader = data[0], _Reader(data, 1)
    if kind == ord("B"):
        final_lsn, commit_us, xid = reader.fixed(_BEGIN)
        message: Message = Begin(final_lsn, _time(commit_us), xid)
    elif kind == ord("C"):
        _, commit_lsn, end_lsn, commit_us = reader.fixed(_COMMIT)
        message = Commit(commit_lsn, end_lsn, _time(commit_us))
    elif kind == ord("R"):
        relation_id, namespace, name = reader.int32(), reader.string(), reader.string()
        reader.int8()  # replica identity setting
        columns = []
        for _ in range(reader.int16()):
            reader.int8()  # flags: part of the key
            columns.append(reader.string())
            reader.fixed(_TYPE_OID_AND_MODIFIER)
        message = Relation(relation_id & 0xFFFFFFFF, namespace, name, tuple(columns))
    elif kind == ord("I"):
        relation_id = reader.int32() & 0xFFFFFFFF
        if reader.take(1) != b"N":
            raise DecodingError("insert without a new tuple")
        message = Insert(relation_id, reader.tuple_data())
    elif kind == ord("M"):
        flags, lsn = reader.fixed(_MESSAGE_HEADER)
        prefix = reader.string()
        message = LogicalMessage(bool(flags & 1), lsn, prefix, reader.take(reader.int32()))
    elif kind in _SKIPPED_KINDS:
        return Skipped(chr(kind))
    else:
        raise DecodingError(f"unknown message kind {chr(kind)!r}")
    reader.ensure_consumed(chr(kind))
    return message


def lsn_text(lsn: int) -> str:
    """An LSN as PostgreSQL writes it (pg_lsn): high and low 32 bits in hex."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) | int(low, 16)
