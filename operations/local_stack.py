"""`python -m operations --local ...`: the commands on a running `make local` stack instead of a deployed one.

The local stack on port PORT (default 3000; `PORT=3001 python -m operations --local redrive`) writes
what the commands need to its state file, `.local-data/stack.json` on the default port and
`.local-data/port-<PORT>/stack.json` on any other (tools/local/stack_state.py writes it): its stack
outputs (the names --stack-name reads from CloudFormation, with the local queue URLs) and the
environment that points the commands' AWS clients at its DynamoDB Local, moto and Lambda Invoke API (the
order database's maintenance function is invoked there, OrderStore=postgres), with fake credentials and
no ~/.aws files, so nothing reaches a real account. This module reads that file alone: the operator
commands stay independent of the local stack's code.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

STATE_ROOT = Path(__file__).resolve().parent.parent / ".local-data"
DEFAULT_PORT = 3000

_outputs: dict[str, dict[str, str]] = {}  # stack name -> outputs, for the stacks found here


def state_path(port: int, root: Path | None = None) -> Path:
    """The state file of the local stack on `port` (the rule tools/local/stack_state.py writes by)."""
    root = root or STATE_ROOT
    return (root if port == DEFAULT_PORT else root / f"port-{port}") / "stack.json"


def _port() -> int:
    raw = os.environ.get("PORT", "") or str(DEFAULT_PORT)
    if not raw.isdigit() or int(raw) == 0:
        raise SystemExit(f"error: PORT must be the port of a running local stack, got {raw!r}")
    return int(raw)


def read_state(port: int, root: Path | None = None) -> dict[str, Any]:
    """The running stack's state; SystemExit saying what to do when there is none on that port."""
    path = state_path(port, root)
    try:
        state = json.loads(path.read_text())
        os.kill(int(state["pid"]), 0)
    except FileNotFoundError:
        raise SystemExit(
            f"error: no local stack runs on port {port} (no {path}); start one (make local PORT={port}) or "
            "set PORT to the port of the one that runs"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"error: the local stack of port {port} is not running ({path}: {exc})") from None
    if not isinstance(state.get("outputs"), dict) or not isinstance(state.get("operator_environment"), dict):
        raise SystemExit(f"error: {path} is not a local stack's state (no outputs or environment)")
    return dict(state)


def use_local_stack(args: argparse.Namespace, root: Path | None = None) -> None:
    """Point this process at the local stack on PORT: its environment, and its outputs for --stack-name."""
    port = _port()
    state = read_state(port, root)
    os.environ.update({str(name): str(value) for name, value in state["operator_environment"].items()})
    name = str(state["stack_name"])
    _outputs[name] = {str(key): str(value) for key, value in state["outputs"].items()}
    args.stack_name = name


def outputs(stack_name: str) -> dict[str, str] | None:
    """The outputs of a local stack found by use_local_stack, by its name (None: not a local stack)."""
    return _outputs.get(stack_name)
