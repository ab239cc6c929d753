"""Reading what a handler logged (Powertools' log records) and printed (its EMF metric lines)."""

from __future__ import annotations

import json
from typing import Any

import pytest


def json_lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def logged_with(caplog: pytest.LogCaptureFixture, message: str) -> list[dict[str, Any]]:
    """The log records with this message, each as its fields (Powertools' `extra` keys included)."""
    return [vars(record) for record in caplog.records if record.getMessage() == message]


def metric_values(out: str, name: str) -> list[float]:
    """Every value of one metric in the EMF lines the handler printed (EMF may list several per line)."""
    values = [line[name] for line in json_lines(out) if "_aws" in line and name in line]
    return [v for value in values for v in (value if isinstance(value, list) else [value])]
