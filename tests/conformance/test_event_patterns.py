"""Event patterns as AWS answers them: the local FilterCriteria matcher against AWS's recorded answers.

event_patterns.json (next to this file) holds one case per (pattern, event) with AWS's answer: the event
matches, does not match, or the pattern is rejected (with AWS's reason). The answers were recorded against
AWS itself (EventBridge TestEventPattern, rules on a bus, and Lambda event source mappings on DynamoDB
streams and SQS queues) by LocalStack's AWS-validated parity tests; each case names its recorded source
(file and line) and when it was last validated against AWS. Two cases ("basis": "documented") rest on the
Lambda guide's DynamoDB filtering page instead: a pattern must name the type key of a typed value.

tools.local.pollers.patterns must give AWS's answer for every case: a rejected pattern must be rejected by
parse_pattern (which is what rejects it when the local stack reads template.yaml), with AWS's reason where
AWS gives one. Pure Python: no local stack is started.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tools.local.pollers.patterns import PatternError, matches, parse_pattern

TABLE: dict[str, Any] = json.loads(Path(__file__).with_name("event_patterns.json").read_text())
CASES: list[dict[str, Any]] = TABLE["cases"]
ANSWERS = {"match", "no-match", "rejected"}
REASON = "Event pattern is not valid. Reason: "
# The pattern-language families the table must cover, each with the answers it must include.
REQUIRED_FAMILIES = {
    "exact": {"match", "no-match"},
    "prefix": {"match", "no-match", "rejected"},
    "suffix": {"match", "no-match", "rejected"},
    "equals-ignore-case": {"match", "no-match", "rejected"},
    "anything-but": {"match", "no-match", "rejected"},
    "numeric": {"match", "no-match", "rejected"},
    "exists": {"match", "no-match"},
    "cidr": {"match", "no-match", "rejected"},
    "wildcard": {"match", "no-match", "rejected"},
    "$or": {"match", "no-match"},
    "arrays": {"match", "no-match", "rejected"},
    "nested-dotted": {"match", "no-match"},
    "null-empty": {"match", "no-match"},
    "dynamodb-typed": {"match", "no-match"},
    "structure": {"match", "rejected"},
    "json": {"rejected"},
}


def pattern_text(case: dict[str, Any]) -> str:
    return str(case["pattern_text"]) if "pattern_text" in case else json.dumps(case["pattern"])


def local_answer(case: dict[str, Any]) -> tuple[str, str]:
    try:
        pattern = parse_pattern(pattern_text(case))
    except PatternError as exc:
        return "rejected", str(exc)
    return ("match" if matches(pattern, case["event"]) else "no-match"), ""


def expected_reason(case: dict[str, Any]) -> str:
    """What the local reason must say: AWS's own reason where AWS gives a precise one."""
    kind = case.get("reason_kind")
    if kind == "json-syntax":  # AWS's text is its JSON parser's; only the kind of reason can agree
        return f"{REASON}not valid JSON"
    if kind == "lambda-generic":  # "Invalid filter pattern definition.": EventBridge's reason instead
        return REASON + str(case["local_reason"])
    return REASON + str(case["aws_reason"])


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_the_local_answer_is_aws_answer(case: dict[str, Any]) -> None:
    answer, reason = local_answer(case)

    assert answer == case["expected"], (
        f"AWS answers {case['expected']}, the local matcher {answer} {reason}; source: {case['source']}"
    )
    if answer == "rejected":
        assert reason.startswith(expected_reason(case)), f"AWS's reason: {case['aws_reason']}"


def test_the_table_is_well_formed_and_covers_every_family() -> None:
    ids = [c["id"] for c in CASES]
    assert len(ids) == len(set(ids)), "case ids are unique"
    for case in CASES:
        assert case["expected"] in ANSWERS, case["id"]
        assert ("pattern" in case) != ("pattern_text" in case), case["id"]
        assert "event" in case, case["id"]
        assert case["source"]["case"], case["id"]
        assert "aws_answer" in case["source"] or case.get("basis") == "documented", case["id"]
        assert (case["expected"] == "rejected") == ("aws_reason" in case), case["id"]
    answers: dict[str, set[str]] = {}
    for case in CASES:
        answers.setdefault(case["family"], set()).add(case["expected"])
    missing = {
        family: sorted(needed - answers.get(family, set()))
        for family, needed in REQUIRED_FAMILIES.items()
        if not needed <= answers.get(family, set())
    }
    assert not missing, f"families without some answers: {missing}"
    assert Counter(c["expected"] for c in CASES)["rejected"] >= 40
