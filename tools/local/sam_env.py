"""`sam local invoke` (SAM CLI, Docker) against the running local stack: the files it reads, the command.

The running `make local` writes two files into .local-data/ and removes them when it stops:

- `sam-env.json`, for `--env-vars`: each function (by logical id) with every variable its template
  Environment declares, valued as the local stack values it for that function (local table names, queue
  URLs, topic ARNs, and for OrderStore=postgres the DATABASE_* settings of the database's forwarder);
- `sam-container-env.json`, for `--container-env-vars`: what the stack sets over every function's
  environment (runtime/functions.forced_environment): the AWS_ENDPOINT_URL_* variables pointing at the
  stack's services as a container reaches them, fake credentials and the region.

Two files because SAM CLI 1.170 (read in its source) applies each to different variables:
- `--env-vars` reaches only the variables the template declares. LocalLambdaRunner._make_env_vars
  (samcli/commands/local/lib/local_lambda.py:333) merges "Parameters" and the function's own block into
  overrides; EnvironmentVariables.resolve (samcli/local/lambdafn/env_vars.py:95) then copies the
  AWS_* variables of _get_aws_variables (:167: the shell's credentials and region) and loops over the
  template's variables only (:108), taking an override for those. The AWS_ENDPOINT_URL_* variables
  boto3 reads are declared nowhere in the template, so from this file they would be dropped, and the
  function would call the real AWS account of the shell's credentials.
- `--container-env-vars` sets variables in the container whatever the template declares
  (LambdaContainer.__init__, samcli/local/docker/lambda_container.py:139: `{**env_vars,
  **container_env_vars}`), but only in a debugging session: LambdaContainer._get_debug_settings (:283)
  returns no variables when there is no debug context or no debug port (:296-302), and a DebugContext
  is false without debug ports (samcli/commands/local/lib/debug_context.py:27). Hence `--debug-port`
  in the command, which for python3.13 starts the same bootstrap (lambda_debug_settings.py:248) but
  lifts the function's timeout to 10 hours (local_lambda.py:52, :309).
"""

from __future__ import annotations

import json
import os
import shlex
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tools.local.runtime.functions import forced_environment, function_environment
from tools.local.services.container_gateway import ContainerAccess, ContainerGateway
from tools.local.stack import ORDER_DATABASE
from tools.template import ROOT, Template

if TYPE_CHECKING:
    from tools.local.services.emulators import Endpoints
    from tools.local.stack import LocalStack

ENV_VARS_FILE = "sam-env.json"
CONTAINER_ENV_FILE = "sam-container-env.json"
# Any free port on the host's 127.0.0.1: SAM CLI publishes it from the container (nothing listens in
# it: no debugger is started for Python without --debug-args).
DEBUG_PORT = 5890


def container_template(template: Template, database_outputs: dict[str, str] | None) -> Template:
    """The stack's template, its order database's outputs (if any) as a container reads them."""
    outputs = {logical_id: dict(values) for logical_id, values in template.application_outputs.items()}
    if database_outputs is not None:
        outputs[ORDER_DATABASE] = database_outputs
    return Template(
        template.data,
        parameters=template.parameter_values,
        stack_name=template.stack_name,
        application_outputs=outputs,
    )


def env_vars_document(
    template: Template, functions: Iterable[str], endpoints: Endpoints
) -> dict[str, dict[str, str]]:
    """`--env-vars`: for each function, each variable its template Environment declares, valued as the
    local stack values it (function_environment, what LocalStack gives the function's workers)."""
    document = {}
    for logical_id in functions:
        spec = template.function(logical_id)
        environment = function_environment(spec, template.physical_name(logical_id), endpoints)
        document[logical_id] = {name: environment[name] for name in spec.environment}
    return document


def container_env_document(endpoints: Endpoints) -> dict[str, str]:
    """`--container-env-vars`: what the stack sets over every function's environment, for a container."""
    return forced_environment(endpoints)


def _write_atomically(path: Path, document: Any) -> None:
    """Readers see the old file or the new one, never a part (a temporary file renamed over it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "w") as file:
            json.dump(document, file, indent=2, sort_keys=True)
            file.write("\n")
        os.chmod(temporary, 0o644)  # mkstemp's 0600: the file holds nothing secret (fake credentials)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


class SamEnvironment:
    """For a running stack: the forwarders a container reaches it through, and the two files (written
    when started, removed when stopped)."""

    def __init__(self, stack: LocalStack, access: ContainerAccess) -> None:
        self.stack = stack
        self.access = access
        directory = stack.options.data_dir
        self.env_vars_path = directory / ENV_VARS_FILE
        self.container_env_path = directory / CONTAINER_ENV_FILE
        database = stack.order_database if stack.template.is_created(ORDER_DATABASE) else None
        self.gateway = ContainerGateway(access, stack.endpoints, database)

    def start(self) -> None:
        """Start the forwarders and write both files (OSError: the listen address cannot be used)."""
        self.gateway.start()
        try:
            template = container_template(self.stack.template, self.gateway.database_outputs)
            endpoints = self.gateway.endpoints
            functions = env_vars_document(template, self.stack.functions, endpoints)
            _write_atomically(self.env_vars_path, functions)
            _write_atomically(self.container_env_path, container_env_document(endpoints))
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        self.env_vars_path.unlink(missing_ok=True)
        self.container_env_path.unlink(missing_ok=True)
        self.gateway.stop()

    def invoke_command(self, function: str, event: Path) -> str:
        """The `sam local invoke` command line (run from the repository, after `sam build`)."""
        parts = ["sam", "local", "invoke", function, "-e", _relative(event)]
        parts += ["--env-vars", _relative(self.env_vars_path)]
        parts += ["--container-env-vars", _relative(self.container_env_path), "--debug-port", str(DEBUG_PORT)]
        if not self.access.host_is_address:
            parts += ["--add-host", f"{self.access.host}:host-gateway"]
        return shlex.join(parts)
