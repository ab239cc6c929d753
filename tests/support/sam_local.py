"""SAM CLI's own local commands run in process, up to the point where they would start a container.

`sam local invoke`, `start-api` and `start-lambda` read the template, find the function, resolve its code,
layers and environment, and only then need a container runtime. Without one (this machine, CI) the plain
command stops with SAM's message before it even looks the function up, so that message alone cannot tell an
accepted template from a refused one. `recording_sam()` runs the same command line through SAM CLI's own
`cli` with two things replaced: the container client (a stand-in, so SAM goes on) and the last step, the
container run (`LambdaRuntime.invoke`, `BaseLocalService.run`), which records what SAM would have run
instead of running it. Everything between (template providers, SAM's plugins, intrinsics, env vars,
`--env-vars` and `--parameter-overrides` handling) is SAM CLI's code, unchanged. One thing is made faster,
not different: SAM CLI parses the same template text four times per command (0.3 s each with PyYAML);
its parser is a pure function of the text, so each text is parsed once and callers get a fresh copy.
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

from samcli import yamlhelper  # type: ignore[import-untyped]
from samcli.cli.main import cli  # type: ignore[import-untyped]
from samcli.local.docker.container_client_factory import ContainerClientFactory  # type: ignore[import-untyped]
from samcli.local.lambdafn.runtime import LambdaRuntime  # type: ignore[import-untyped]
from samcli.local.services.base_local_service import BaseLocalService  # type: ignore[import-untyped]

# SAM CLI's own words when no container runtime answers (samcli/local/docker/container_client_factory.py).
NO_CONTAINER_RUNTIME = (
    "Running AWS SAM projects locally requires a container runtime."
    " Do you have Docker or Finch installed and running?"
)


@dataclass(frozen=True)
class Invocation:
    """What `sam local invoke` would have run in its container."""

    function: str
    runtime: str
    architecture: str
    handler: str
    code: str
    layers: list[str]
    environment: dict[str, str]
    event: Any


@dataclass(frozen=True)
class Service:
    """What `sam local start-api` / `start-lambda` would have served."""

    kind: str
    routes: list[tuple[str, str, tuple[str, ...]]]  # (function, path, methods) of start-api
    functions: list[str]  # start-lambda's invocable functions


@dataclass
class SamRun:
    invocations: list[Invocation] = field(default_factory=list)
    services: list[Service] = field(default_factory=list)
    error: BaseException | None = None


def _invocation(config: Any, event: str) -> Invocation:
    return Invocation(
        function=config.name,
        runtime=config.runtime,
        architecture=config.architecture,
        handler=config.handler,
        code=config.code_abs_path,
        layers=[getattr(layer, "name", str(layer)) for layer in config.layers],
        environment=config.env_vars.resolve(),
        event=json.loads(event),
    )


def _service(service: Any) -> Service:
    api = getattr(service, "api", None)
    routes = [(r.function_name, r.path, tuple(sorted(r.methods))) for r in getattr(api, "routes", [])]
    runner = getattr(service, "lambda_runner", None)
    provider = getattr(runner, "provider", None)
    functions = sorted(f.name for f in provider.get_all()) if provider is not None and not routes else []
    return Service(type(service).__name__, routes, functions)


@contextmanager
def recording_sam() -> Iterator[Any]:
    """A `run(args) -> SamRun` that runs `sam <args>` in process, recording instead of starting containers."""

    current = SamRun()

    def invoke(self: Any, function_config: Any, event: str, *args: Any, **kwargs: Any) -> None:
        current.invocations.append(_invocation(function_config, event))

    def serve(self: Any) -> None:
        current.services.append(_service(self))

    def run(args: list[str]) -> SamRun:
        nonlocal current
        current = SamRun()
        try:
            cli.main(args, prog_name="sam", standalone_mode=False)
        except BaseException as exc:  # noqa: BLE001 (a refused template surfaces as any exception; the test reports it)
            current.error = exc
        return current

    stand_in = mock.MagicMock(name="container client")
    with ExitStack() as patches:
        patches.enter_context(
            mock.patch.object(ContainerClientFactory, "create_client", staticmethod(lambda *a, **k: stand_in))
        )
        patches.enter_context(mock.patch.object(LambdaRuntime, "invoke", invoke))
        patches.enter_context(mock.patch.object(BaseLocalService, "run", serve))
        parse = _parsed_once(yamlhelper.yaml_parse)
        for module in [
            m for m in list(sys.modules.values()) if getattr(m, "yaml_parse", None) is yamlhelper.yaml_parse
        ]:
            patches.enter_context(mock.patch.object(module, "yaml_parse", parse))
        yield run


def _parsed_once(parse: Any) -> Any:
    parsed: dict[str, Any] = {}

    def parse_once(text: str) -> Any:
        if text not in parsed:
            parsed[text] = parse(text)
        return copy.deepcopy(parsed[text])

    return parse_once
