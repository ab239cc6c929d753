"""The pgoutput decoder against the layouts of "Logical Replication Message Formats" (PostgreSQL 18 docs,
https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html), protocol version 1:
each message here is built field by field as that page lists them, then decoded."""

from __future__ import annotations

import struct
from datetime import UTC, datetime

import pytest

from shop.adapters.postgres.pgoutput import (
    Begin,
    Commit,
    DecodingError,
    Insert,
    LogicalMessage,
    Relation,
    Skipped,
    decode_message,
    lsn_text,
    parse_lsn,
)

COMMIT_TIME = datetime(2026, 11, 25, 13, 11, 0, 518158, tzinfo=UTC)
COMMIT_MICROS = int((COMMIT_TIME - datetime(2000, 1, 1, tzinfo=UTC)).total_seconds() * 1_000_000)


def string(text: str) -> bytes:
    return text.encode() + b"\x00"


def test_begin_carries_the_final_lsn_commit_time_and_xid() -> None:
    # Byte1('B'), Int64 final LSN, Int64 commit timestamp (µs since 2000-01-01), Int32 xid
    message = b"B" + struct.pack("!qqi", 0x172C7F0, COMMIT_MICROS, 754)
    assert decode_message(message) == Begin(0x172C7F0, COMMIT_TIME, 754)


def test_commit_carries_the_end_lsn_a_consumer_confirms_to() -> None:
    # Byte1('C'), Int8 flags, Int64 commit LSN, Int64 end LSN, Int64 commit timestamp
    message = b"C" + struct.pack("!bqqq", 0, 0x172C7C0, 0x172C7F0, COMMIT_MICROS)
    assert decode_message(message) == Commit(0x172C7C0, 0x172C7F0, COMMIT_TIME)


def relation_message(relation_id: int, columns: list[str]) -> bytes:
    # Byte1('R'), Int32 OID, String namespace, String name, Int8 replica identity, Int16 columns, then per
    # column: Int8 flags, String name, Int32 type OID, Int32 type modifier
    body = (
        struct.pack("!i", relation_id)
        + string("public")
        + string("outbox")
        + struct.pack("!bh", ord("d"), len(columns))
    )
    for index, name in enumerate(columns):
        body += struct.pack("!b", 1 if index == 0 else 0) + string(name) + struct.pack("!ii", 25, -1)
    return b"R" + body


def test_relation_names_its_columns_in_order() -> None:
    decoded = decode_message(relation_message(16385, ["position", "event_id", "trace_header"]))
    assert decoded == Relation(16385, "public", "outbox", ("position", "event_id", "trace_header"))


def test_an_oid_above_two_to_the_31_reads_unsigned() -> None:
    # OIDs are unsigned 32-bit; the page writes Int32, which a signed read would make negative.
    decoded = decode_message(relation_message(-5, ["position"]))
    assert isinstance(decoded, Relation)
    assert decoded.relation_id == 2**32 - 5


def insert_message(relation_id: int, values: list[bytes | None]) -> bytes:
    # Byte1('I'), Int32 OID, Byte1('N'), TupleData: Int16 columns, then per column Byte1('n') for NULL or
    # Byte1('t'), Int32 length, the value's text
    body = struct.pack("!i", relation_id) + b"N" + struct.pack("!h", len(values))
    for value in values:
        body += b"n" if value is None else b"t" + struct.pack("!i", len(value)) + value
    return b"I" + body


def test_insert_gives_text_values_and_none_for_null() -> None:
    envelope = '{"id": "é"}'.encode()
    decoded = decode_message(insert_message(16385, [b"7", envelope, None]))
    assert decoded == Insert(16385, ("7", '{"id": "é"}', None))


def test_a_logical_decoding_message_carries_its_prefix_and_content() -> None:
    # Byte1('M'), Int8 flags (1: transactional), Int64 LSN, String prefix, Int32 length, Byte_n content
    message = (
        b"M" + struct.pack("!bq", 1, 0x172C700) + string("outbox.replay") + struct.pack("!i", 5) + b"[1,2]"
    )
    assert decode_message(message) == LogicalMessage(True, 0x172C700, "outbox.replay", b"[1,2]")


@pytest.mark.parametrize("kind", list("OYUDT"))
def test_messages_the_relay_does_not_use_are_skipped_not_misread(kind: str) -> None:
    assert decode_message(kind.encode() + b"\x00\x00\x00\x01anything") == Skipped(kind)


@pytest.mark.parametrize(
    "message",
    [
        b"",
        b"Z\x00",  # no such message kind
        b"B" + struct.pack("!qq", 1, 2),  # truncated: the xid is missing
        b"B" + struct.pack("!qqi", 1, 2, 3) + b"\x00",  # a byte too many
        insert_message(1, [b"x"])[:-1],  # a value shorter than its length says
        b"I" + struct.pack("!i", 1) + b"K" + struct.pack("!h", 0),  # an insert without a new tuple
        b"I" + struct.pack("!i", 1) + b"N" + struct.pack("!h", 1) + b"u",  # unchanged TOAST in an insert
        b"R" + struct.pack("!i", 1) + b"public",  # an unterminated string
        # a value's length that reads negative (the decoder would step back over what it read)
        b"I" + struct.pack("!i", 1) + b"N" + struct.pack("!h", 1) + b"t" + struct.pack("!i", -4),
        b"M" + struct.pack("!bq", 1, 1) + b"p\x00" + struct.pack("!i", -1),  # a message content's length too
    ],
)
def test_bytes_that_are_not_a_whole_v1_message_are_refused(message: bytes) -> None:
    with pytest.raises(DecodingError):
        decode_message(message)


def test_lsn_text_round_trips_as_postgresql_writes_it() -> None:
    assert lsn_text(0x1_0172C7F0) == "1/172C7F0"
    assert parse_lsn("1/172C7F0") == 0x1_0172C7F0
    assert parse_lsn(lsn_text(0)) == 0


# --- integer widths ---------------------------------------------------------------------------------------
# Every field below holds a value that only its own width, read unsigned where PostgreSQL sends an unsigned
# quantity (LSNs are XLogRecPtr, xids TransactionId, relation ids Oid, lengths and counts never negative;
# proto.c writes each with pq_sendint64/32/16 and reads it back with pq_getmsgint64 or pq_getmsgint), can
# carry: a decoder that reads a field narrower, signed, or from the wrong half gives another number.
LSN_ABOVE_2_32 = 0x0000_16A3_8F00_2C48  # 16A3/8F002C48: a server that has written 90 TB of WAL
END_LSN_ABOVE_2_32 = 0x0000_16A3_8F00_2D10
XID_ABOVE_2_31 = 3_000_000_123  # past 2^31: half the 32-bit xid space consumed, as on any busy cluster
OID_ABOVE_2_31 = 2_147_500_000  # OIDs wrap around 2^32; tables created late in a cluster's life get these
MANY_COLUMNS = 300  # past 255: the count is an Int16
LONG_VALUE = b"x" * 70_000  # past 65535 bytes: the length is an Int32


def test_begin_reads_an_lsn_above_two_to_the_32_whole() -> None:
    message = b"B" + struct.pack("!QqI", LSN_ABOVE_2_32, COMMIT_MICROS, 70_000)
    decoded = decode_message(message)
    assert decoded == Begin(LSN_ABOVE_2_32, COMMIT_TIME, 70_000)
    assert lsn_text(decoded.final_lsn) == "16A3/8F002C48"


def test_begin_reads_an_xid_above_two_to_the_31_unsigned() -> None:
    message = b"B" + struct.pack("!QqI", LSN_ABOVE_2_32, COMMIT_MICROS, XID_ABOVE_2_31)
    decoded = decode_message(message)
    assert isinstance(decoded, Begin)
    assert decoded.xid == XID_ABOVE_2_31


def test_commit_reads_both_lsns_above_two_to_the_32_whole() -> None:
    message = b"C" + struct.pack("!BQQq", 0, LSN_ABOVE_2_32, END_LSN_ABOVE_2_32, COMMIT_MICROS)
    assert decode_message(message) == Commit(LSN_ABOVE_2_32, END_LSN_ABOVE_2_32, COMMIT_TIME)


def test_a_logical_decoding_message_reads_its_lsn_above_two_to_the_32_and_a_long_content() -> None:
    content = b"[" + b"1," * 40_000 + b"2]"  # a replay naming 40,001 positions: longer than 65535 bytes
    message = (
        b"M"
        + struct.pack("!BQ", 1, LSN_ABOVE_2_32)
        + string("outbox.replay")
        + struct.pack("!I", len(content))
        + content
    )
    assert decode_message(message) == LogicalMessage(True, LSN_ABOVE_2_32, "outbox.replay", content)


def test_a_relation_reads_an_oid_above_two_to_the_31_and_more_than_255_columns() -> None:
    names = [f"c{n}" for n in range(MANY_COLUMNS)]
    message = b"R" + struct.pack("!I", OID_ABOVE_2_31) + string("public") + string("outbox")
    message += struct.pack("!BH", ord("d"), MANY_COLUMNS)
    for index, name in enumerate(names):
        # Int8 flags, String name, Int32 type OID (text, 25), Int32 type modifier (-1: none, signed)
        message += struct.pack("!B", 1 if index == 0 else 0) + string(name) + struct.pack("!Ii", 25, -1)

    assert decode_message(message) == Relation(OID_ABOVE_2_31, "public", "outbox", tuple(names))


def test_an_insert_reads_an_oid_above_two_to_the_31_more_than_255_values_and_a_long_one() -> None:
    """The insert's relation id must equal its Relation's, or the relay reads no row of the outbox."""
    values: list[bytes | None] = [*(str(n).encode() for n in range(MANY_COLUMNS - 2)), LONG_VALUE, None]
    message = b"I" + struct.pack("!I", OID_ABOVE_2_31) + b"N" + struct.pack("!H", len(values))
    for value in values:
        message += b"n" if value is None else b"t" + struct.pack("!I", len(value)) + value

    decoded = decode_message(message)

    assert decoded == Insert(OID_ABOVE_2_31, tuple(None if v is None else v.decode() for v in values))
