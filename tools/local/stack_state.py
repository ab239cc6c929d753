"""Where a running `make local` keeps its state, one directory per API port, and how commands find it.

The default port (PORT=3000) keeps `.local-data/`, as always; any other port keeps `.local-data/port-<PORT>/`.
Each holds that stack's logs, its DynamoDB files (PERSIST=1), PostgreSQL data, stream positions, the
files for `sam local invoke`, and `stack.json`, written once the stack serves and removed when it stops:
its process, endpoints and stack outputs, and the environment the operator commands need to act on it.
`make invoke` and `python -m operations --local` read the `stack.json` of the port they are pointed at
(PORT), so two stacks in one clone never read, overwrite or remove each other's. A lock file held while a
stack runs keeps a second one from starting in the same directory (it would empty the first one's
PostgreSQL data and take over its files before finding the port taken).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from tools.local.processes import StartupError, accepts_connections
from tools.local.services.emulators import FAKE_CREDENTIALS
from tools.local.stack import DEFAULT_DATA_DIR
from tools.template import REGION

if TYPE_CHECKING:
    from tools.local.stack import LocalStack

STATE_ROOT = DEFAULT_DATA_DIR  # .local-data
DEFAULT_PORT = 3000
STATE_FILE = "stack.json"
_LOCK_FILE = "stack.lock"
# The relay's settings the operator commands share (shop.runtime.config): the republish window, event size.
_RELAY_SETTINGS = ("OUTBOX_TTL_DAYS", "MAX_EVENT_BYTES", "OUTBOX_TIME_SHARDS")
# Stack outputs naming functions: invoked through the local API's Lambda Invoke API (gateway/lambda_api.py).
_FUNCTION_OUTPUT_SUFFIX = "FunctionName"


def state_dir(port: int, root: Path | None = None) -> Path:
    """The state directory of the stack whose API is on `port` (under STATE_ROOT unless given a root)."""
    root = root or STATE_ROOT
    return root if port == DEFAULT_PORT else root / f"port-{port}"


def state_file(port: int, root: Path | None = None) -> Path:
    return state_dir(port, root) / STATE_FILE


def running_ports(root: Path | None = None) -> list[int]:
    """The API ports of the stacks running from this clone (each one's stack.json, its process alive)."""
    root = root or STATE_ROOT
    candidates = [DEFAULT_PORT] + [
        int(path.name.removeprefix("port-"))
        for path in root.glob("port-*")
        if path.name.removeprefix("port-").isdigit()
    ]
    return sorted(port for port in set(candidates) if running_stack(state_file(port, root)) is not None)


def operator_environment(stack: LocalStack) -> dict[str, str]:
    """What `python -m operations` needs to act on this stack: its endpoints, fake credentials and region,
    no ~/.aws files (they must not send a command to a real account), the relay's outbox settings. Besides
    the functions' endpoints: Lambda's Invoke API (the order database's maintenance function, which the
    functions never call) and STS on moto (discard-poison records the caller's identity)."""
    relay: dict[str, str] = {}
    for stream in stack.sources.streams:
        relay = stack.template.function(stream.function).environment
        break
    lambda_api = {"AWS_ENDPOINT_URL_LAMBDA": stack.api_url} if stack.api is not None else {}
    return {
        **FAKE_CREDENTIALS,
        **stack.endpoints.environment(),
        **lambda_api,
        "AWS_ENDPOINT_URL_STS": stack.endpoints.moto,
        "AWS_REGION": REGION,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        **{name: relay[name] for name in _RELAY_SETTINGS if name in relay},
    }


def local_outputs(stack: LocalStack) -> dict[str, str]:
    """The stack outputs as the operator commands read them (--stack-name), with this stack's queue URLs;
    the functions' names only when the stack serves the Lambda API to invoke them by (it does with its
    local API), so that no command sends an invocation elsewhere."""
    template = stack.template
    outputs: dict[str, str] = {}
    for name, value in template.outputs().items():
        if name.endswith(_FUNCTION_OUTPUT_SUFFIX) and stack.api is None:
            continue
        reference = template.data["Outputs"][name].get("Value")
        target = reference.get("Ref") if isinstance(reference, dict) else None
        is_queue = template.resources.get(str(target), {}).get("Type") == "AWS::SQS::Queue"
        outputs[name] = stack.queue_url(str(target)) if is_queue else value
    return outputs


def write_state(stack: LocalStack, path: Path) -> None:
    """Record a running stack, so `make invoke` and the operator commands can use it (written whole,
    then renamed into place: a reader never sees half a file)."""
    state = {
        "pid": os.getpid(),
        "port": stack.api.port if stack.api is not None else None,
        "stack_name": stack.template.stack_name,
        # What make invoke needs to run a function as this stack runs it: the parameters it was started
        # with and its nested application's outputs (OrderStore=postgres: the embedded database).
        "parameters": dict(stack.template.parameter_values),
        "application_outputs": stack.template.application_outputs,
        "data_dir": str(stack.options.data_dir),
        "endpoints": {"dynamodb": stack.endpoints.dynamodb, "moto": stack.endpoints.moto},
        "api_url": stack.api_url if stack.api is not None else None,
        "outputs": local_outputs(stack),
        "operator_environment": operator_environment(stack),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(state, indent=2))
    partial.replace(path)


def remove_state(path: Path) -> None:
    """Remove the state file if this process wrote it (never another stack's)."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        if json.loads(path.read_text())["pid"] == os.getpid():
            path.unlink()


def running_stack(path: Path) -> dict[str, Any] | None:
    """The state of a running stack, if one is up (a stale file from a killed stack is ignored)."""
    try:
        state = json.loads(path.read_text())
        os.kill(int(state["pid"]), 0)
        ports = [int(url.rsplit(":", 1)[1]) for url in state["endpoints"].values()]
    except (OSError, ValueError, KeyError, AttributeError, TypeError):
        return None
    return state if all(accepts_connections(port) for port in ports) else None


class StateLock:
    """Held while a stack runs from a state directory: a second stack for it fails at once, saying why."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / _LOCK_FILE
        self._file: IO[str] | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = self.path.open("a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            lock.close()
            raise StartupError(
                f"a local stack (process {holder}) already runs from {self.path.parent}: stop it, or start "
                "this one on another port (PORT=...)"
            ) from None
        lock.truncate(0)
        lock.write(str(os.getpid()))
        lock.flush()
        self._file = lock

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # closing releases the lock
            self._file = None

    def __enter__(self) -> StateLock:
        self.acquire()
        return self

    def __exit__(self, *_: object) -> None:
        self.release()
