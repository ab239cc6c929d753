"""The docker-free local stack for the integration tests, started once per session on free ports.

Its fixtures (`local_services`, `local_stack`, `probe_stack`) are defined in tests/conftest.py, so
tests/conformance shares the same ones in a session that runs both; the helpers (tests/local_stacks.py)
stay importable from here.
"""

from __future__ import annotations

from tests.local_stacks import (
    PROBE_FRAGMENT,
    PROBE_FUNCTIONS,
    assert_processes_gone,
    probe_template_data,
    start_stack,
    stop_stack,
)

__all__ = [
    "PROBE_FRAGMENT",
    "PROBE_FUNCTIONS",
    "assert_processes_gone",
    "probe_template_data",
    "start_stack",
    "stop_stack",
]
