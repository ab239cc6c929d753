"""The operator's command line, `python -m operations` (operations/admin.py), run against the local stack:
the inspector's redrive buttons (tools/local/inspector/actions.py) and the chaos recovery scenarios
(tools/chaos/recovery_scenarios.py) run it this way.

It runs as the operator runs it, in a process of its own: the operations code reads its endpoints and
settings from the process environment and keeps its AWS clients for the life of the process
(shop.adapters.aws), so running it inside the stack's process would point the stack's own clients (and a
test session's) elsewhere. Its environment is the operator's pointed at the local stack (the endpoints,
fake credentials, no ~/.aws files, as every function of the stack gets them) with the relay's outbox
settings; what it printed is read back as JSON lines (CommandRun).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from tools.local.runtime.functions import forced_environment
from tools.template import ROOT, Template

if TYPE_CHECKING:
    from tools.local.pollers.event_sources import EventSources
    from tools.local.services.emulators import Endpoints

# The relay's settings the commands share (shop.runtime.config): the republish window and event size.
RELAY_SETTINGS = ("OUTBOX_TTL_DAYS", "MAX_EVENT_BYTES", "OUTBOX_TIME_SHARDS")


class CommandStack(Protocol):
    """The stack a command's environment is read from (a LocalStack; a fake in unit tests)."""

    @property
    def template(self) -> Template: ...
    @property
    def sources(self) -> EventSources: ...
    @property
    def endpoints(self) -> Endpoints: ...


@dataclass(frozen=True)
class CommandRun:
    argv: list[str]
    exit_code: int
    stdout: str
    stderr: str
    seconds: float

    def documents(self) -> list[dict[str, Any]]:
        """The JSON lines it printed, less Powertools' log lines (those carry a "level")."""
        found = []
        for line in self.stdout.splitlines():
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict) and "level" not in value:
                found.append(value)
        return found

    def reports(self) -> list[dict[str, Any]]:
        """The recovery report it printed per message (or per replay)."""
        return [d for d in self.documents() if "complete" in d]

    def summary(self) -> dict[str, Any] | None:
        """The closing line: how many messages were redriven, kept, and the events parked on the way."""
        return next((d for d in self.documents() if "redriven" in d and "kept" in d), None)

    def report(self) -> dict[str, Any]:
        """The run as a document (what the inspector's page shows)."""
        documents = self.documents()
        return {
            "command": " ".join(["python", *self.argv[1:]]),
            "exitCode": self.exit_code,
            "seconds": round(self.seconds, 2),
            "summary": self.summary(),
            "messages": self.reports(),  # a recovery report per message
            "errors": [d for d in documents if "error" in d and "complete" not in d],
            "stderr": self.stderr.strip()[-4000:],
        }


def command_environment(stack: CommandStack) -> dict[str, str]:
    """The operator's environment pointed at the local stack: its endpoints, fake credentials, no ~/.aws
    files (they must not send the command to a real account), and the relay's outbox settings."""
    stream = next(iter(stack.sources.streams), None)
    relay_environment = stack.template.function(stream.function).environment if stream else {}
    return {
        **os.environ,
        **forced_environment(stack.endpoints),
        **{name: relay_environment[name] for name in RELAY_SETTINGS if name in relay_environment},
    }


def run_command(argv: list[str], env: dict[str, str], timeout: float) -> CommandRun:
    """Run `argv` in the repository (where `-m operations` is found) and return what it printed; past
    `timeout` seconds it is stopped, and its run says so (exit code -1)."""
    began = time.monotonic()
    try:
        completed = subprocess.run(
            argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        stdout = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        message = f"the command did not finish within {timeout:g} s"
        return CommandRun(argv, -1, stdout, message, time.monotonic() - began)
    seconds = time.monotonic() - began
    return CommandRun(argv, completed.returncode, completed.stdout, completed.stderr, seconds)
