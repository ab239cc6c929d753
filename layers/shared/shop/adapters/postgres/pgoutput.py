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


class _Reader:
    def __init__(self, data: bytes) -> None:
        self._data = data
        self._offset = 0

    def take(self, size: int) -> bytes:
        end = self._offset + size
        if end > len(self._data):
            raise DecodingError(f"message truncated: needs {end} bytes, has {len(self._data)}")
        chunk = self._data[self._offset : end]
        self._offset = end
        return chunk

    def unpack(self, fmt: str) -> tuple[int, ...]:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))

    def int8(self) -> int:
        return self.unpack("!b")[0]

    def int16(self) -> int:
        return self.unpack("!h")[0]

    def int32(self) -> int:
        return self.unpack("!i")[0]

    def int64(self) -> int:
        return self.unpack("!q")[0]

    def string(self) -> str:
        end = self._data.find(b"\x00", self._offset)
        if end < 0:
            raise DecodingError("unterminated string")
        text = self._data[self._offset : end].decode()
        self._offset = end + 1
        return text

    def timestamp(self) -> datetime:
        return POSTGRES_EPOCH + timedelta(microseconds=self.int64())

    def ensure_consumed(self, kind: str) -> None:
        if self._offset != len(self._data):
            raise DecodingError(f"{kind}: {len(self._data) - self._offset} bytes left over")


def decode_message(data: bytes) -> Message:
    """One pgoutput v1 message."""
    if not data:
        raise DecodingError("empty message")
    kind, reader = data[0], _Reader(data[1:])
    if kind == ord("B"):
        final_lsn, commit_us, xid = reader.unpack("!qqI")  # the xid is a TransactionId: unsigned
        message: Message = Begin(final_lsn, POSTGRES_EPOCH + timedelta(microseconds=commit_us), xid)
    elif kind == ord("C"):
        reader.int8()  # flags, currently unused
        commit_lsn, end_lsn = reader.int64(), reader.int64()
        message = Commit(commit_lsn, end_lsn, reader.timestamp())
    elif kind == ord("R"):
        relation_id, namespace, name = reader.int32(), reader.string(), reader.string()
        reader.int8()  # replica identity setting
        columns = []
        for _ in range(reader.int16()):
            reader.int8()  # flags: part of the key
            columns.append(reader.string())
            reader.unpack("!ii")  # type OID, type modifier
        message = Relation(relation_id & 0xFFFFFFFF, namespace, name, tuple(columns))
    elif kind == ord("I"):
        relation_id = reader.int32() & 0xFFFFFFFF
        if reader.take(1) != b"N":
            raise DecodingError("insert without a new tuple")
        message = Insert(relation_id, _tuple_data(reader))
    elif kind == ord("M"):
        flags, lsn = reader.int8(), reader.int64()
        prefix = reader.string()
        message = LogicalMessage(bool(flags & 1), lsn, prefix, reader.take(reader.int32()))
    elif kind in _SKIPPED_KINDS:
        return Skipped(chr(kind))
    else:
        raise DecodingError(f"unknown message kind {chr(kind)!r}")
    reader.ensure_consumed(chr(kind))
    return message


def _tuple_data(reader: _Reader) -> tuple[str | None, ...]:
    values: list[str | None] = []
    for _ in range(reader.int16()):
        form = reader.take(1)
        if form == b"n":
            values.append(None)
        elif form == b"t":
            values.append(reader.take(reader.int32()).decode())
        else:  # 'u' (an unchanged TOASTed value) never occurs in an insert; 'b' needs the binary option
            raise DecodingError(f"unexpected column form {form!r} in an insert")
    return tuple(values)


def lsn_text(lsn: int) -> str:
    """An LSN as PostgreSQL writes it (pg_lsn): high and low 32 bits in hex."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) | int(low, 16)
