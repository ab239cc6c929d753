"""One function's execution environment: a process that imports the handler once and runs invocations.

Started by tools.local.runtime.launchers, as
`python -m tools.local.runtime.worker CONFIG_JSON REQUEST_FD RESPONSE_FD` or forked by the fork
server, with exactly the environment the template gives the function. Requests and responses are
JSON lines on two pipes, so the handler's own stdout and stderr stay free for its logs, as in Lambda.
"""

from __future__ import annotations

import decimal
import importlib
import importlib.util
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import IO, Any

from tools.local.runtime.context import LambdaContext

ROOT = Path(__file__).resolve().parents[3]  # the repository (tools/local/runtime/worker.py)
_PARENT_POLL_SECONDS = 0.5


class HandlerNotFound(Exception):
    pass


class _LambdaJSONEncoder(json.JSONEncoder):
    """The Python runtime serialises Decimal results (from DynamoDB) as numbers."""

    def default(self, o: Any) -> Any:
        if isinstance(o, decimal.Decimal):
            return int(o) if o == o.to_integral_value() else float(o)
        return super().default(o)


def _error(error_type: str, message: str, trace: list[str] | None = None) -> dict[str, Any]:
    return {"errorType": error_type, "errorMessage": message, "stackTrace": trace or []}


def _exception_error(exc: BaseException, error_type: str | None = None) -> dict[str, Any]:
    trace = traceback.format_list(traceback.extract_tb(exc.__traceback__))
    return _error(error_type or type(exc).__name__, str(exc), [line.rstrip() for line in trace])


def _exit_with_parent(parent: int) -> None:
    """End this environment when the stack's process is gone, even mid-invocation."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_PARENT_POLL_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _preload_harness_modules() -> None:
    """Run the modules a test harness names in LOCAL_WORKER_PRELOAD (file paths, comma-separated).

    The seam for fault injection: a harness wraps the SDK inside the function's process without any
    branch in the function's code. Loaded before the import path is narrowed to the function's own.
    """
    for path in filter(None, os.environ.get("LOCAL_WORKER_PRELOAD", "").split(",")):
        spec = importlib.util.spec_from_file_location(f"_preload_{Path(path).stem}", path)
        if spec is None or spec.loader is None:
            raise ImportError(f"LOCAL_WORKER_PRELOAD: cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)


def _isolate_import_path(code_dir: Path, layer_dirs: list[Path]) -> None:
    # The function sees its code, its layers and the runtime's packages; not this repository.
    runtime = [
        entry
        for entry in sys.path
        if entry
        and Path(entry).resolve() != ROOT
        and (not Path(entry).resolve().is_relative_to(ROOT) or ".venv" in Path(entry).parts)
    ]
    sys.path[:] = [str(code_dir), *(str(d) for d in layer_dirs), *runtime]
    os.chdir(code_dir)


def _load_handler(handler: str) -> Any:
    module_name, _, function_name = handler.rpartition(".")
    module = importlib.import_module(module_name.replace("/", "."))
    function = getattr(module, function_name, None)
    if not callable(function):
        raise HandlerNotFound(f"Handler '{function_name}' missing on module '{module_name}'")
    return function


def _init(handler: str) -> tuple[Any, dict[str, Any] | None]:
    """Import the handler as the Python runtime does, classifying failures with its error types."""
    try:
        return _load_handler(handler), None
    except HandlerNotFound as exc:
        return None, _error("Runtime.HandlerNotFound", str(exc))
    except SyntaxError as exc:
        return None, _exception_error(exc, "Runtime.UserCodeSyntaxError")
    except ImportError as exc:
        return None, _exception_error(exc, "Runtime.ImportModuleError")
    except Exception as exc:  # noqa: BLE001 - process boundary: any init failure is reported, not raised
        traceback.print_exc()
        return None, _exception_error(exc)


def _send(channel: IO[bytes], message: dict[str, Any]) -> None:
    channel.write(json.dumps(message, cls=_LambdaJSONEncoder).encode() + b"\n")
    channel.flush()


def _invoke(function: Any, request: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    context = LambdaContext(
        function_name=config["function_name"],
        timeout_seconds=request["remaining_ms"] / 1000,
        memory_limit_in_mb=config["memory_mb"],
        aws_request_id=request["request_id"],
        log_group_name=config["log_group_name"],
        log_stream_name=config["log_stream_name"],
    )
    if request.get("trace_id"):
        os.environ["_X_AMZN_TRACE_ID"] = request["trace_id"]
    try:
        payload = function(request["event"], context)
    except Exception as exc:  # noqa: BLE001 - process boundary: a handler error is the invocation's result
        # The runtime logs unhandled errors in this form before answering with them.
        print(f"[ERROR] {type(exc).__name__}: {exc}", file=sys.stderr)
        traceback.print_exc()
        return {"type": "error", "error": _exception_error(exc)}
    try:
        json.dumps(payload, cls=_LambdaJSONEncoder)
    except (TypeError, ValueError) as exc:
        return {
            "type": "error",
            "error": _error("Runtime.MarshalError", f"Unable to marshal response: {exc}"),
        }
    return {"type": "result", "payload": payload}


def serve(config: dict[str, Any], request_fd: int, response_fd: int) -> None:
    """Init the function, then answer invocations until the request pipe closes."""
    requests = os.fdopen(request_fd, "rb")
    responses = os.fdopen(response_fd, "wb")
    _exit_with_parent(os.getppid())
    # Pipes are block-buffered by default; line buffering keeps the log view live.
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    sys.stderr.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    _preload_harness_modules()
    _isolate_import_path(Path(config["code_dir"]), [Path(d) for d in config["layer_dirs"]])

    started = time.monotonic()
    function, init_error = _init(config["handler"])
    if init_error is not None:
        _send(responses, {"type": "init_error", "error": init_error})
        sys.exit(1)  # Lambda retries the init on the next invocation, in a fresh environment
    _send(responses, {"type": "ready", "init_ms": (time.monotonic() - started) * 1000})

    for line in requests:  # EOF: the stack closed the pipe (or died)
        request = json.loads(line)
        try:
            response = _invoke(function, request, config)
        except BaseException as exc:
            # sys.exit() or similar inside the handler ends the environment, as in Lambda.
            _send(responses, {"type": "error", "error": _exception_error(exc, "Runtime.ExitError")})
            raise
        _send(responses, {**response, "request_id": request["request_id"]})


def main(argv: list[str]) -> None:
    serve(json.loads(argv[1]), int(argv[2]), int(argv[3]))


if __name__ == "__main__":
    main(sys.argv)
