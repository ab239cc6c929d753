"""AWS's policy evaluation of requests, by @cloud-copilot/iam-simulate (tools/iam/README.md says why).

`decisions(requests)` evaluates a batch in a Node process (simulate.mjs, started at the first batch and
kept for the next ones until this process exits): for each request, the
principal's identity policies and the resource's policy, as AWS does: an explicit Deny wins, then an
Allow (from the identity policies for a principal of the resource's account, from the resource policy
for a service principal), else the default deny; Action/NotAction, Resource/NotResource, wildcards and
every condition operator. Requests whose input the simulator rejects (an action AWS does not have, an
ARN that is no resource type of the action, an invalid policy) come back as `Error`, never as a denial.
"""

from __future__ import annotations

import atexit
import json
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.template import ACCOUNT

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "simulate.mjs"
# The Makefile's stamp: `npm ci` in tools/iam from its lock (make test-unit and make test depend on it).
INSTALLED = HERE / "node_modules" / ".installed"
SIMULATOR = HERE / "node_modules" / "@cloud-copilot" / "iam-simulate"

Policy = Mapping[str, Any]
ContextValue = str | tuple[str, ...]

ALLOWED = "Allowed"
EXPLICITLY_DENIED = "ExplicitlyDenied"
IMPLICITLY_DENIED = "ImplicitlyDenied"
ERROR = "Error"


class SimulatorError(RuntimeError):
    """The simulator is not installed, or its process failed."""


@dataclass(frozen=True)
class Request:
    """One authorisation AWS makes: may `principal` do `action` on `resource`, in this context?

    `principal` is a role session's ARN (arn:aws:sts::<account>:assumed-role/<role>/<session>) or a
    service principal (events.amazonaws.com). `identity_policies` are the principal's (name, document)
    pairs, `resource_policy` the resource's own policy if it has one. `who` names the caller in reports
    (a function's logical id, "EventBridge InventoryRule", ...).
    """

    who: str
    principal: str
    action: str
    resource: str
    identity_policies: tuple[tuple[str, Policy], ...] = ()
    resource_policy: Policy | None = None
    context: Mapping[str, ContextValue] = field(default_factory=dict)
    account: str = ACCOUNT  # the resource's account

    def __str__(self) -> str:
        context = ", ".join(f"{k}={v}" for k, v in sorted(self.context.items()))
        return f"{self.who}: {self.action} on {self.resource}" + (f" ({context})" if context else "")


@dataclass(frozen=True)
class Statement:
    """A statement that decided: its policy's kind ("identity", "resource"), the policy's name (identity
    policies: "<logical id>/<policy name>"), its Sid and its 1-based index in the policy. An implicit
    denial names the kind of policy that allowed nothing (no index)."""

    policy_type: str
    policy: str | None = None
    sid: str | None = None
    index: int | None = None

    def __str__(self) -> str:
        if self.index is None:
            return f"no {self.policy_type} statement allows it"
        statement = self.sid or f"#{self.index}"
        return " ".join(part for part in (self.policy_type, self.policy, statement) if part)


@dataclass(frozen=True)
class Decision:
    request: Request
    result: str  # Allowed, ExplicitlyDenied, ImplicitlyDenied or Error
    error: Any = None
    grants: tuple[Statement, ...] = ()
    denials: tuple[Statement, ...] = ()

    @property
    def allowed(self) -> bool:
        return self.result == ALLOWED

    def __str__(self) -> str:
        if self.result == ERROR:
            return f"{self.request}: {self.result} {json.dumps(self.error)}"
        why = self.grants if self.allowed else self.denials
        return f"{self.request}: {self.result}" + (f" by {'; '.join(map(str, why))}" if why else "")


def _statement(reason: Mapping[str, Any]) -> Statement:
    return Statement(reason["policyType"], reason.get("policy"), reason.get("sid"), reason.get("index"))


def _canonical(policy: Policy) -> str:
    return json.dumps(policy, sort_keys=True, separators=(",", ":"))


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        raise SimulatorError("node (Node 20) is required to evaluate IAM policies (tools/iam)")
    if not SIMULATOR.is_dir():
        stamp = INSTALLED.relative_to(HERE.parents[1])
        raise SimulatorError(
            f"@cloud-copilot/iam-simulate is not installed: run `make {stamp}` (npm ci in {HERE})"
        )
    return node


class _Simulator:
    """simulate.mjs answering batches, a line each way (starting Node and loading AWS's service reference
    data takes most of a batch's time: a test session starts it once)."""

    def __init__(self, node: str) -> None:
        self.errors = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115  (closed with the process)
        self.process = subprocess.Popen(  # noqa: S603  (node and a script of this repository, no shell)
            [node, str(SCRIPT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.errors,
            text=True,
            cwd=HERE,
        )
        atexit.register(self.close)

    def answer(self, batch: Mapping[str, Any]) -> list[dict[str, Any]]:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        try:
            self.process.stdin.write(json.dumps(batch) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            self.errors.seek(0)
            errors = self.errors.read().strip()
            self.close()
            raise SimulatorError(f"simulate.mjs stopped ({self.process.returncode}): {errors}")
        answers: list[dict[str, Any]] = json.loads(line)
        return answers

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        self.errors.close()


_running: list[_Simulator] = []


def _simulator() -> _Simulator:
    node = _node()  # installed still (a failed `npm ci` removes it)
    if not _running or not _running[0].running:
        _running[:] = [_Simulator(node)]
    return _running[0]


def decisions(requests: Sequence[Request]) -> list[Decision]:
    """Each request's decision, in order, from one batch to the simulator."""
    if not requests:
        return []
    policies: dict[str, Policy] = {}
    ids: dict[str, str] = {}

    def policy_id(policy: Policy) -> str:
        text = _canonical(policy)
        if text not in ids:
            ids[text] = f"p{len(ids)}"
            policies[ids[text]] = policy
        return ids[text]

    batch = {
        "policies": policies,
        "requests": [
            {
                "principal": request.principal,
                "action": request.action,
                "resource": request.resource,
                "account": request.account,
                "context": {k: list(v) if isinstance(v, tuple) else v for k, v in request.context.items()},
                "identityPolicies": [[name, policy_id(policy)] for name, policy in request.identity_policies],
                "resourcePolicy": None
                if request.resource_policy is None
                else policy_id(request.resource_policy),
            }
            for request in requests
        ],
    }
    answers = _simulator().answer(batch)
    if len(answers) != len(requests):
        raise SimulatorError(f"simulate.mjs answered {len(answers)} of {len(requests)} requests")
    return [
        Decision(
            request=request,
            result=answer["result"],
            error=answer["error"],
            grants=tuple(dict.fromkeys(_statement(r) for r in answer["grants"])),
            denials=tuple(dict.fromkeys(_statement(r) for r in answer["denials"])),
        )
        for request, answer in zip(requests, answers, strict=True)
    ]
