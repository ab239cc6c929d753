"""Functions as local execution environments: worker processes per function, invoked synchronously.

A function has up to its maximum concurrency of environments, started on demand and reused when
idle; each serves one invocation at a time, as a Lambda sandbox does. Beyond its reserved concurrency
Lambda throttles an invocation (TooManyRequestsException, the function not run); event sources ask for
that answer, other callers wait for an environment (see FunctionRuntime.invoke). Each worker gets exactly the
environment its template definition gives it (Globals and its own Environment, resolved), plus what
Lambda itself sets, the local endpoints and fake credentials. An invocation that outlives the
function's Timeout is a function error (Sandbox.Timedout) and its environment is replaced, as Lambda
does.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import secrets
import select
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from tools.local.runtime.launchers import (
    Launcher,
    LaunchError,
    SubprocessLauncher,
    WorkerPipes,
    WorkerProcess,
)
from tools.local.services.emulators import FAKE_CREDENTIALS, Endpoints
from tools.template import REGION, FunctionSpec

# Lambda allows 10 s for the init phase of an on-demand environment.
INIT_TIMEOUT_SECONDS = 10.0
# Lambda's limit on a synchronous invocation's request and response payloads: 6 MB each (Lambda quotas,
# "Invocation payload (request and response)"), 6,291,456 bytes; the event source mappings' batches stay
# within it ("up to the payload limit for synchronous invocation (6 MB)": EventSourceMappingConfiguration).
SYNC_PAYLOAD_LIMIT = 6_291_456
# Time for the worker's answer to arrive after the deadline before the worker is considered hung. An answer
# that arrives in it is still a timeout (AWS: an invocation that runs past its Timeout fails with "Task timed
# out"), so code that stops "just before the deadline" cannot overrun it locally and pass.
_DEADLINE_GRACE_SECONDS = 0.25
# Execution environments per function when the template reserves no concurrency for it.
MAX_CONCURRENCY_VARIABLE = "LOCAL_MAX_CONCURRENCY"
DEFAULT_MAX_CONCURRENCY = 4
# Lambda's error for an invocation throttled before the function ran (HTTP 429).
THROTTLED = "TooManyRequestsException"

LogEcho = Callable[[str, str], None]
_LOG_READ_BYTES = 1 << 16


@dataclass(frozen=True)
class FunctionError:
    error_type: str
    message: str
    stack_trace: tuple[str, ...] = ()

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> FunctionError:
        return cls(
            error_type=str(payload.get("errorType", "Unknown")),
            message=str(payload.get("errorMessage", "")),
            stack_trace=tuple(str(line) for line in payload.get("stackTrace", [])),
        )

    def to_payload(self) -> dict[str, Any]:
        """The error document Lambda returns for a failed invocation."""
        return {
            "errorType": self.error_type,
            "errorMessage": self.message,
            "stackTrace": list(self.stack_trace),
        }


@dataclass(frozen=True)
class InvocationResult:
    request_id: str
    payload: Any = None
    error: FunctionError | None = None
    duration_ms: float = 0.0
    cold_start: bool = False
    environment_number: int = 0  # the execution environment that ran it (0: none did)
    started_at: float = 0.0  # epoch seconds when it was asked for (the inspector's waterfall); 0: unknown
    trace_header: str | None = None  # the _X_AMZN_TRACE_ID it ran with (active tracing), for the inspector

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def throttled(self) -> bool:
        """Refused before the function ran (its reserved concurrency was in use): nothing was executed."""
        return self.error is not None and self.error.error_type == THROTTLED and self.environment_number == 0


def forced_environment(endpoints: Endpoints) -> dict[str, str]:
    """What the stack sets over every function's template environment: fake credentials, the region and
    the local endpoints (a `sam local invoke` container gets the same: tools/local/sam_env.py)."""
    return {
        **FAKE_CREDENTIALS,
        "AWS_REGION": REGION,
        "AWS_DEFAULT_REGION": REGION,
        # The developer's ~/.aws files must not redirect or configure the function's clients.
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "POWERTOOLS_TRACE_DISABLED": "true",
        **endpoints.environment(),
    }


def function_environment(spec: FunctionSpec, physical_name: str, endpoints: Endpoints) -> dict[str, str]:
    """The complete environment of a function's process; nothing is inherited from the stack's shell."""
    reserved = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "TZ": ":UTC",
        "LAMBDA_TASK_ROOT": str(spec.code_uri),
        "_HANDLER": spec.handler,
        "AWS_EXECUTION_ENV": f"AWS_Lambda_{spec.runtime or 'python3.13'}",
        "AWS_LAMBDA_FUNCTION_NAME": physical_name,
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(spec.memory_size),
        "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
        "AWS_LAMBDA_LOG_GROUP_NAME": f"/aws/lambda/{physical_name}",
        "AWS_LAMBDA_LOG_STREAM_NAME": "local",
    }
    return {**reserved, **spec.environment, **forced_environment(endpoints)}


def _trace_header() -> str:
    # The shape Lambda puts in _X_AMZN_TRACE_ID for active tracing (not sampled: there is no daemon).
    return f"Root=1-{int(time.time()):08x}-{secrets.token_hex(12)};Parent={secrets.token_hex(8)};Sampled=0"


class WorkerExited(RuntimeError):
    pass


class _Channel:
    """JSON lines over a pair of pipes, with a deadline on every read."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self._read_fd = read_fd
        self._writer = os.fdopen(write_fd, "wb")
        self._buffer = b""

    def send(self, message: Mapping[str, Any]) -> None:
        try:
            self._writer.write(json.dumps(message).encode() + b"\n")
            self._writer.flush()
        except (BrokenPipeError, ValueError) as exc:
            raise WorkerExited("the function's process is gone") from exc

    def receive(self, deadline: float) -> dict[str, Any] | None:
        """The next message, or None when the deadline passes first."""
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                readable, _, _ = select.select([self._read_fd], [], [], remaining)
            except (OSError, ValueError) as exc:
                raise WorkerExited("the function's process is gone") from exc
            if not readable:
                continue
            try:
                chunk = os.read(self._read_fd, 1 << 20)
            except OSError as exc:
                raise WorkerExited("the function's process is gone") from exc
            if not chunk:
                raise WorkerExited("the function's process exited")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        message = json.loads(line)
        assert isinstance(message, dict)
        return message

    def close(self) -> None:
        # Either end may already be closed along with the process.
        with contextlib.suppress(OSError):
            self._writer.close()
        with contextlib.suppress(OSError):
            os.close(self._read_fd)


@dataclass(eq=False)
class _Environment:
    """One execution environment: a worker process, used by one invocation at a time."""

    number: int
    process: WorkerProcess
    channel: _Channel
    ready: bool = False
    init_error: FunctionError | None = None
    log_pump: threading.Thread | None = field(default=None)
    discarded: bool = False  # killed, or to be killed: never handed out again


class _Stopped(Exception):
    pass


class _Throttled(Exception):
    pass


def default_max_concurrency() -> int:
    """LOCAL_MAX_CONCURRENCY, else 4: environments per function when the template reserves none."""
    raw = os.environ.get(MAX_CONCURRENCY_VARIABLE, "")
    try:
        value = int(raw) if raw else DEFAULT_MAX_CONCURRENCY
    except ValueError:
        raise ValueError(f"{MAX_CONCURRENCY_VARIABLE} must be a whole number, got {raw!r}") from None
    if value < 1:
        raise ValueError(f"{MAX_CONCURRENCY_VARIABLE} must be at least 1, got {value}")
    return value


class FunctionRuntime:
    """A function's execution environments, as Lambda keeps them: created on demand, reused when idle.

    Up to `max_concurrency` environments (the function's ReservedConcurrentExecutions, else the
    stack's maximum) run invocations at the same time; each one serialises its own, as one Lambda
    sandbox does. An invocation finding every environment busy at the maximum waits for one, unless
    it asks to be throttled as Lambda throttles beyond reserved concurrency (event sources do: see
    invoke). A warm environment is reused before a new one is started.
    """

    def __init__(
        self,
        spec: FunctionSpec,
        physical_name: str,
        environment: Mapping[str, str],
        log_path: Path,
        echo: LogEcho | None = None,
        tracing: bool = False,
        launcher: Launcher | None = None,
        max_concurrency: int | None = None,
    ) -> None:
        self.spec = spec
        self.physical_name = physical_name
        self.environment = dict(environment)
        self.log_path = log_path
        self._echo = echo
        self._tracing = tracing
        self._launcher: Launcher = launcher or SubprocessLauncher()
        if max_concurrency is None:
            max_concurrency = (
                spec.reserved_concurrency
                if spec.reserved_concurrency is not None
                else default_max_concurrency()
            )
        self.max_concurrency = max_concurrency
        # ReservedConcurrentExecutions: when set, an invocation beyond it can be throttled; without it
        # Lambda would scale out, so an invocation waits for the local pool instead.
        self.reserved_concurrency = spec.reserved_concurrency
        self._condition = threading.Condition()
        self._environments: list[_Environment] = []  # every live environment, idle or busy
        self._idle: list[_Environment] = []  # the most recently used last: reused first
        self._starting = 0  # environments being launched (counted against the maximum)
        self._numbers = itertools.count(1)
        self._stopped = False
        self._busy = 0
        self.peak_concurrency = 0  # the most invocations that ran at once

    @property
    def logical_id(self) -> str:
        return self.spec.logical_id

    # --- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        """Start one environment's init (importing the handler) without waiting for it."""
        with self._condition:
            if self._environments or self._starting or self._stopped or self.max_concurrency < 1:
                return
            self._starting += 1
        with contextlib.suppress(_Stopped):
            self._add(self._launch_counted(), idle=True)

    def wait_ready(self, timeout: float = INIT_TIMEOUT_SECONDS) -> FunctionError | None:
        """Wait for the init phase of an environment (starting one if needed); returns its error, if any."""
        if self.max_concurrency < 1:
            return None  # no environment is ever started
        try:
            environment = self._acquire()
        except _Stopped:
            return FunctionError("Local.Stopped", "the stack is stopping")
        try:
            return self._await_init(environment, time.monotonic() + timeout)
        finally:
            self._release(environment, busy=False)

    def child_pids(self) -> list[int]:
        with self._condition:
            return [environment.process.pid for environment in self._environments]

    def environment_numbers(self) -> list[int]:
        """The live execution environments (numbered from 1 in the order they were started)."""
        with self._condition:
            return [environment.number for environment in self._environments]

    def stop(self) -> None:
        """Kill every environment; an invocation in progress ends with WorkerExited when its process goes."""
        with self._condition:
            self._stopped = True
            environments, self._environments = self._environments, []
            idle, self._idle = set(self._idle), []
            for environment in environments:
                environment.discarded = True
            self._condition.notify_all()
        for environment in environments:
            if environment in idle:
                self._dispose(environment)
            else:
                environment.process.kill()  # its invocation sees the exit and closes the environment

    # --- invocations ------------------------------------------------------------------------------
    def invoke(self, event: Any, request_id: str | None = None, throttle: bool = False) -> InvocationResult:
        """Run the function on an environment of its own and return what it answered.

        With `throttle`, an invocation that finds the function's reserved concurrency all in use is
        refused at once (TooManyRequestsException, `throttled`), as Lambda refuses it; event source
        mappings take that answer and retry as AWS documents for each of them. Otherwise it waits for
        an environment. A function with ReservedConcurrentExecutions 0 is always throttled.
        """
        request_id = request_id or str(uuid.uuid4())
        started_at = time.time()
        started = time.monotonic()
        try:
            environment = self._acquire(throttle)
        except _Stopped:
            return InvocationResult(request_id, error=FunctionError("Local.Stopped", "the stack is stopping"))
        except LaunchError as exc:
            return InvocationResult(request_id, error=FunctionError("Local.LaunchFailed", str(exc)))
        except _Throttled:
            message = (
                "Rate Exceeded. (ReservedFunctionConcurrentInvocationLimitExceeded: "
                f"ReservedConcurrentExecutions is {self.reserved_concurrency})"
            )
            return InvocationResult(request_id, error=FunctionError(THROTTLED, message))
        with self._condition:
            self._busy += 1
            self.peak_concurrency = max(self.peak_concurrency, self._busy)
        try:
            return replace(self._invoke_on(environment, event, request_id, started), started_at=started_at)
        finally:
            self._release(environment, busy=True)

    def _invoke_on(
        self, environment: _Environment, event: Any, request_id: str, started: float
    ) -> InvocationResult:
        cold = not environment.ready
        init_error = self._await_init(environment, time.monotonic() + INIT_TIMEOUT_SECONDS)
        if init_error is not None:
            environment.discarded = True  # Lambda retries the init in a fresh environment
            return InvocationResult(
                request_id, error=init_error, cold_start=True, environment_number=environment.number
            )
        deadline = time.monotonic() + self.spec.timeout
        trace_header = _trace_header() if self._tracing else None
        request = {
            "request_id": request_id,
            "event": event,
            "remaining_ms": int(self.spec.timeout * 1000),
            "trace_id": trace_header,
        }
        try:
            environment.channel.send(request)
            response = environment.channel.receive(deadline + _DEADLINE_GRACE_SECONDS)
        except WorkerExited:
            environment.discarded = True
            error = FunctionError("Runtime.ExitError", "the function's process exited during the invocation")
            return self._result(request_id, environment, started, cold, error=error)
        if response is None or time.monotonic() > deadline:
            environment.discarded = True  # a timed-out sandbox is never reused
            message = f"Task timed out after {self.spec.timeout:.2f} seconds"
            return self._result(
                request_id, environment, started, cold, error=FunctionError("Sandbox.Timedout", message)
            )
        if response["type"] == "error":
            error = FunctionError.from_payload(response["error"])
            if error.error_type == "Runtime.ExitError":
                environment.discarded = True
            return self._result(request_id, environment, started, cold, error=error)
        return replace(
            self._result(request_id, environment, started, cold, payload=response.get("payload")),
            trace_header=trace_header,
        )

    @staticmethod
    def _result(
        request_id: str,
        environment: _Environment,
        started: float,
        cold: bool,
        payload: Any = None,
        error: FunctionError | None = None,
    ) -> InvocationResult:
        return InvocationResult(
            request_id,
            payload=payload,
            error=error,
            duration_ms=(time.monotonic() - started) * 1000,
            cold_start=cold,
            environment_number=environment.number,
        )

    # --- the pool ---------------------------------------------------------------------------------
    def _acquire(self, throttle: bool = False) -> _Environment:
        """An idle environment, else a new one below the maximum, else the next one to become idle
        (_Throttled instead, when asked to, if the maximum is the function's reserved concurrency)."""
        with self._condition:
            while True:
                if self._stopped:
                    raise _Stopped
                if self._idle:
                    return self._idle.pop()
                if len(self._environments) + self._starting < self.max_concurrency:
                    self._starting += 1
                    break
                if self.max_concurrency < 1 or (throttle and self.reserved_concurrency is not None):
                    raise _Throttled
                self._condition.wait()
        return self._add(self._launch_counted(), idle=False)

    def _launch_counted(self) -> _Environment:
        """Launch an environment whose slot the caller counted in _starting."""
        try:
            return self._spawn()
        except BaseException:
            with self._condition:
                self._starting -= 1
                self._condition.notify()
            raise

    def _add(self, environment: _Environment, idle: bool) -> _Environment:
        with self._condition:
            self._starting -= 1
            if self._stopped:
                environment.discarded = True
            else:
                self._environments.append(environment)
                if idle:
                    self._idle.append(environment)
                    self._condition.notify()
                return environment
        self._dispose(environment)
        raise _Stopped

    def _release(self, environment: _Environment, busy: bool) -> None:
        with self._condition:
            if busy:
                self._busy -= 1
            if not environment.discarded and not self._stopped:
                self._idle.append(environment)
                self._condition.notify()
                return
            environment.discarded = True
            if environment in self._environments:
                self._environments.remove(environment)
            self._condition.notify()  # room for a new environment
        self._dispose(environment)

    # --- processes --------------------------------------------------------------------------------
    def _spawn(self) -> _Environment:
        request_read, request_write = os.pipe()
        response_read, response_write = os.pipe()
        output_read, output_write = os.pipe()
        config = {
            "handler": self.spec.handler,
            "code_dir": str(self.spec.code_uri),
            "layer_dirs": [str(d) for d in self.spec.layer_dirs],
            "function_name": self.physical_name,
            "memory_mb": self.spec.memory_size,
            "log_group_name": f"/aws/lambda/{self.physical_name}",
            "log_stream_name": "local",
        }
        pipes = WorkerPipes(request_read, response_write, output_write)
        try:
            process = self._launcher.launch(self.spec.logical_id, config, self.environment, pipes)
        except BaseException:
            for fd in (request_write, response_read, output_read):
                os.close(fd)
            raise
        finally:
            for fd in (request_read, response_write, output_write):
                os.close(fd)  # the worker has its own copies now
        environment = _Environment(
            number=next(self._numbers), process=process, channel=_Channel(response_read, request_write)
        )
        environment.log_pump = threading.Thread(
            target=self._pump_logs,
            args=(os.fdopen(output_read, "rb"),),
            name=f"logs-{self.logical_id}-{environment.number}",
            daemon=True,
        )
        environment.log_pump.start()
        return environment

    def _await_init(self, environment: _Environment, deadline: float) -> FunctionError | None:
        if environment.ready or environment.init_error is not None:
            return environment.init_error
        try:
            message = environment.channel.receive(deadline)
        except WorkerExited:
            code = environment.process.exit_code()
            environment.init_error = FunctionError(
                "Runtime.ExitError", f"the function's process exited during init (exit code {code})"
            )
            return environment.init_error
        if message is None:
            environment.init_error = FunctionError(
                "Sandbox.Timedout", f"init did not finish within {INIT_TIMEOUT_SECONDS:.0f} s"
            )
        elif message["type"] == "init_error":
            environment.init_error = FunctionError.from_payload(message["error"])
        else:
            environment.ready = True
        return environment.init_error

    @staticmethod
    def _dispose(environment: _Environment) -> None:
        environment.process.kill()
        environment.channel.close()
        if environment.log_pump is not None:
            environment.log_pump.join(timeout=2)

    def _pump_logs(self, stream: IO[bytes]) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # Whatever the pipe holds is written at once (one write per read, not per line); the file is
        # flushed each time, so it is as current as the pipe.
        unfinished = b""
        with self.log_path.open("ab") as log:
            while chunk := stream.read1(_LOG_READ_BYTES):  # type: ignore[attr-defined]
                log.write(chunk)
                log.flush()
                if self._echo is not None:
                    *lines, unfinished = (unfinished + chunk).split(b"\n")
                    for raw in lines:
                        self._echo(self.logical_id, raw.decode(errors="replace"))
            if self._echo is not None and unfinished:
                self._echo(self.logical_id, unfinished.decode(errors="replace"))
        stream.close()
