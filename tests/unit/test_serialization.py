"""The camelCase JSON keys of operator reports and inspector documents (shop/domain/serialization.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from shop.domain.serialization import camel_case, camel_fields


@dataclass
class Report:
    dry_run: bool
    dead_letter_for: str
    event_ids: list[str] = field(default_factory=list)


def test_fields_keep_their_declared_order_under_camel_case_names_and_their_own_values():
    report = Report(dry_run=True, dead_letter_for="q", event_ids=["e-1"])
    document = camel_fields(report)
    assert list(document) == ["dryRun", "deadLetterFor", "eventIds"]
    assert document["eventIds"] is report.event_ids  # not a copy: the caller serializes it


def test_an_omitted_field_is_left_out_and_a_misspelt_one_is_an_error():
    report = Report(dry_run=False, dead_letter_for="q")
    assert camel_fields(report, omit={"event_ids"}) == {"dryRun": False, "deadLetterFor": "q"}
    with pytest.raises(ValueError, match="event_id"):
        camel_fields(report, omit={"event_id"})


@pytest.mark.parametrize(
    ("name", "camel"), [("id", "id"), ("in_flight", "inFlight"), ("start_ms", "startMs")]
)
def test_camel_case(name: str, camel: str):
    assert camel_case(name) == camel
