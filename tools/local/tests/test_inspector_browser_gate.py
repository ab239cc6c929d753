"""Whether the inspector's browser tests run, skip or fail (tools/local/inspector/browser.py): skipped,
saying why, where there is no Chromium; failed where there is none and CI is set (CI=true), so a CI run
never passes with them skipped."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.local.inspector.browser import browser_tests_gate, running_in_ci


@pytest.fixture
def chromium(tmp_path: Path) -> str:
    """An executable where CHROMIUM points: what the gate checks for (it starts nothing)."""
    path = tmp_path / "chromium"
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return str(path)


def test_with_chromium_the_browser_tests_run_in_ci_and_out(chromium: str) -> None:
    assert browser_tests_gate({"CHROMIUM": chromium}) == ("run", None)
    assert browser_tests_gate({"CHROMIUM": chromium, "CI": "true"}) == ("run", None)


def test_without_chromium_outside_ci_they_are_skipped_saying_why(tmp_path: Path) -> None:
    absent = str(tmp_path / "no-chromium")

    assert browser_tests_gate({"CHROMIUM": absent}) == (
        "skip",
        f"browser tests: no Chromium at {absent} (CHROMIUM): `make browser` installs it"
        " (Debian: apt-get install chromium, as root)",
    )
    assert browser_tests_gate({"CHROMIUM": absent, "CI": "false"})[0] == "skip"


def test_without_chromium_in_ci_they_fail_saying_why(tmp_path: Path) -> None:
    absent = str(tmp_path / "no-chromium")
    not_executable = tmp_path / "chromium-not-executable"
    not_executable.write_text("")

    outcome, why = browser_tests_gate({"CHROMIUM": absent, "CI": "true"})

    assert outcome == "fail"
    assert why is not None
    assert why.startswith("CI=true: the inspector's browser tests must run in CI, and cannot: ")
    assert f"no Chromium at {absent} (CHROMIUM): `make browser` installs it" in why
    assert browser_tests_gate({"CHROMIUM": str(not_executable), "CI": "true"})[0] == "fail"


@pytest.mark.parametrize(
    ("value", "ci"),
    [("true", True), ("TRUE", True), ("1", True), ("yes", True), ("", False), ("false", False), ("0", False)],
)
def test_ci_is_what_ci_services_set(value: str, ci: bool) -> None:
    assert running_in_ci({"CI": value}) is ci
    assert running_in_ci({}) is False
