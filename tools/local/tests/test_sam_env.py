"""`sam local invoke` against the running local stack (tools/local/sam_env.py): the two files SAM CLI reads,
what SAM CLI's own code makes of them, and the forwarders a container reaches the stack through. No test
needs Docker: SAM CLI's environment resolution and debug settings are called as `sam local invoke` calls
them, short of a container; the forwarders are exercised on loopback addresses.
"""

from __future__ import annotations

import json
import socket
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest
from samcli.commands.local.lib.debug_context import DebugContext  # type: ignore[import-untyped]
from samcli.commands.local.lib.local_lambda import LocalLambdaRunner  # type: ignore[import-untyped]
from samcli.lib.providers.sam_function_provider import SamFunctionProvider  # type: ignore[import-untyped]
from samcli.lib.providers.sam_stack_provider import SamLocalStackProvider  # type: ignore[import-untyped]
from samcli.local.docker.lambda_container import LambdaContainer  # type: ignore[import-untyped]

from shop.adapters.postgres.connection import ConnectionSettings, open_connection
from tools.local.runtime.functions import function_environment
from tools.local.sam_env import (
    DEBUG_PORT,
    SamEnvironment,
    container_env_document,
    container_template,
    env_vars_document,
)
from tools.local.services.container_gateway import (
    LISTEN_VARIABLE,
    ContainerAccess,
    ContainerGateway,
    Forwarder,
    tcp_backend,
)
from tools.local.services.emulators import FAKE_CREDENTIALS, Endpoints
from tools.local.services.order_database import DatabaseLocation
from tools.local.stack import ORDER_DATABASE, StackOptions
from tools.template import REGION, TEMPLATE_PATH, Template

if TYPE_CHECKING:
    from tools.local.stack import LocalStack

HOST = "host.docker.internal"
# The stack's services as its own functions reach them, and as a container does (gateway ports).
STACK_ENDPOINTS = Endpoints(dynamodb="http://127.0.0.1:48001", moto="http://127.0.0.1:48002")
CONTAINER_ENDPOINTS = Endpoints(dynamodb=f"http://{HOST}:48001", moto=f"http://{HOST}:48102")
DATABASE = DatabaseLocation(socket_dir="/repo/.local-data/postgres", port=5432, name="local")
DATABASE_FOR_CONTAINERS = {**DATABASE.outputs(), "Endpoint": HOST, "Port": "48103"}
# The variables the order database's location gives (template.yaml's Globals): a container's differ.
DATABASE_LOCATION_VARIABLES = {"DATABASE_HOST": HOST, "DATABASE_PORT": "48103"}
STORES = ("dynamodb", "postgres")


def stack_template(store: str) -> Template:
    """template.yaml as `make local ORDER_STORE=<store>` reads it (the order database on its socket)."""
    if store == "postgres":
        return Template.load(
            parameters={"OrderStore": "postgres"}, application_outputs={ORDER_DATABASE: DATABASE.outputs()}
        )
    return Template.load()


def stack_functions(template: Template) -> list[str]:
    return [f for f in template.of_type("AWS::Serverless::Function") if template.is_created(f)]


def sam_functions(store: str) -> dict[str, Any]:
    """The functions as `sam local invoke` finds them (SAM CLI's providers, template.yaml)."""
    with warnings.catch_warnings():  # samtranslator's validator warns about its own deprecations
        warnings.simplefilter("ignore", DeprecationWarning)
        stacks, _ = SamLocalStackProvider.get_stacks(
            str(TEMPLATE_PATH), parameter_overrides={"OrderStore": store}
        )
        return {function.name: function for function in SamFunctionProvider(stacks).get_all()}


# --- the files ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("store", STORES)
def test_every_declared_variable_has_the_value_the_stack_gives_the_function(store: str) -> None:
    template = stack_template(store)
    functions = stack_functions(template)
    database = DATABASE_FOR_CONTAINERS if store == "postgres" else None

    document = env_vars_document(container_template(template, database), functions, CONTAINER_ENDPOINTS)

    assert json.loads(json.dumps(document)) == document  # SAM's --env-vars format: {LogicalId: {VAR: value}}
    assert sorted(document) == sorted(functions)
    for function in functions:
        spec = template.function(function)
        # What LocalStack gives the function's workers (tools/local/stack.py, _create_functions).
        given = function_environment(spec, template.physical_name(function), STACK_ENDPOINTS)
        expected = {name: given[name] for name in spec.environment}
        if store == "postgres":
            expected |= DATABASE_LOCATION_VARIABLES  # the database as the container reaches it
        assert document[function] == expected, function
        assert all(isinstance(value, str) for value in document[function].values())
    if store == "postgres":
        assert document["OrdersApiFunction"]["ORDER_STORE"] == "postgres"
        assert document["OrdersApiFunction"]["DATABASE_SECRET_ARN"] == DATABASE.secret_name


def test_the_container_file_points_every_endpoint_at_the_stacks_ports_with_fake_credentials() -> None:
    document = container_env_document(CONTAINER_ENDPOINTS)

    assert all(
        isinstance(k, str) and isinstance(v, str) for k, v in document.items()
    )  # flat, as SAM merges it
    endpoint_variables = STACK_ENDPOINTS.environment()
    assert {"AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL_SQS", "AWS_ENDPOINT_URL_SNS"} <= set(
        endpoint_variables
    )
    for name, url in endpoint_variables.items():
        port = url.rsplit(":", 1)[1]
        # DynamoDB Local listens on every interface (its own port); moto through the gateway's.
        expected = (
            f"http://{HOST}:{port}"
            if name.startswith("AWS_ENDPOINT_URL_DYNAMODB")
            else f"http://{HOST}:48102"
        )
        assert document[name] == expected, name
    assert {k: document[k] for k in FAKE_CREDENTIALS} == FAKE_CREDENTIALS
    assert document["AWS_REGION"] == document["AWS_DEFAULT_REGION"] == REGION


# --- what SAM CLI makes of them -------------------------------------------------------------------------
@pytest.mark.parametrize("store", STORES)
def test_sam_applies_the_env_vars_file_to_declared_variables_and_drops_the_others(store: str) -> None:
    template = stack_template(store)
    functions = stack_functions(template)
    database = DATABASE_FOR_CONTAINERS if store == "postgres" else None
    document: dict[str, dict[str, str]] = env_vars_document(
        container_template(template, database), functions, CONTAINER_ENDPOINTS
    )
    undeclared = {"AWS_ENDPOINT_URL_SQS": "http://elsewhere:1"}
    runner = LocalLambdaRunner(
        local_runtime=None,
        function_provider=None,
        cwd=".",
        real_path=".",
        env_vars_values={**document, "Parameters": undeclared},
    )
    found = sam_functions(store)

    for function in functions:
        # What `sam local invoke --env-vars` gives the container (LocalLambdaRunner.get_invoke_config).
        environment = runner._make_env_vars(found[function]).resolve()
        assert {name: environment[name] for name in document[function]} == document[function], function
        assert "AWS_ENDPOINT_URL_SQS" not in environment  # not declared: why the second file exists


def test_sam_sets_the_container_file_only_with_a_debug_port() -> None:
    document = container_env_document(CONTAINER_ENDPOINTS)

    with_port = DebugContext(debug_ports=(DEBUG_PORT,), container_env_vars=document)
    _, applied = LambdaContainer._get_debug_settings("python3.13", with_port)
    without_port = DebugContext(container_env_vars=document)
    _, ignored = LambdaContainer._get_debug_settings("python3.13", without_port)

    assert applied == document
    assert ignored == {}


# --- the forwarders -------------------------------------------------------------------------------------
@pytest.fixture
def echo_port() -> Iterator[int]:
    """A TCP server on 127.0.0.1 answering each read with the same bytes upper-cased."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stopping = threading.Event()

    def serve() -> None:
        while not stopping.is_set():
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            with connection:
                while data := connection.recv(1024):
                    connection.sendall(data.upper())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stopping.set()
    thread.join()
    server.close()


def test_a_forwarder_relays_both_ways_and_stops_listening_when_stopped(echo_port: int) -> None:
    # 127.0.0.2 stands for docker0's address: another address than the one the service listens on
    forwarder = Forwarder("echo", "127.0.0.2", tcp_backend(echo_port))
    forwarder.start()
    try:
        with socket.create_connection(("127.0.0.2", forwarder.port), timeout=5) as client:
            client.sendall(b"ping")
            assert client.recv(1024) == b"PING"
    finally:
        forwarder.stop()

    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.2", forwarder.port), timeout=5).close()


def test_the_gateway_forwards_moto_only_where_moto_does_not_listen(echo_port: int) -> None:
    endpoints = Endpoints(dynamodb="http://127.0.0.1:48001", moto=f"http://127.0.0.1:{echo_port}")
    on_loopback = ContainerGateway(ContainerAccess(HOST, "127.0.0.1"), endpoints, None)
    on_bridge = ContainerGateway(ContainerAccess(HOST, "127.0.0.2"), endpoints, None)
    on_loopback.start()
    on_bridge.start()
    try:
        assert on_loopback.endpoints.moto == f"http://{HOST}:{echo_port}"
        bridge_port = int(on_bridge.endpoints.moto.rsplit(":", 1)[1])
        assert bridge_port != echo_port
        with socket.create_connection(("127.0.0.2", bridge_port), timeout=5) as client:
            client.sendall(b"moto")
            assert client.recv(1024) == b"MOTO"
        assert on_bridge.endpoints.dynamodb == f"http://{HOST}:48001"  # DynamoDB Local: every interface
    finally:
        on_loopback.stop()
        on_bridge.stop()


def test_a_function_reaches_the_order_database_over_tls_through_the_gateway(
    postgres_server: ConnectionSettings,
) -> None:
    # Given the stack's database, on its Unix socket only, and the gateway for containers on 127.0.0.1
    database = DatabaseLocation(postgres_server.host, postgres_server.port, postgres_server.dbname)
    gateway = ContainerGateway(ContainerAccess("127.0.0.1", "127.0.0.1"), STACK_ENDPOINTS, database)
    gateway.start()
    try:
        outputs = gateway.database_outputs
        assert outputs is not None
        # When a function connects with its own code (a host name: sslmode=require)
        settings = ConnectionSettings(
            host=outputs["Endpoint"],
            port=int(outputs["Port"]),
            dbname=outputs["DatabaseName"],
            user=outputs["MasterUsername"],
            password=lambda _: "the secret's password (the socket trusts it)",
        )
        with open_connection(settings) as connection:
            # Then it is served, over TLS, by the stack's database
            assert connection.pgconn.ssl_in_use
            assert connection.execute("SELECT current_database()").fetchone() == (postgres_server.dbname,)
    finally:
        gateway.stop()


def test_the_settings_choose_the_host_and_the_listen_address() -> None:
    assert ContainerAccess.from_environment({LISTEN_VARIABLE: "off"}) is None
    chosen = ContainerAccess.from_environment(
        {LISTEN_VARIABLE: "172.17.0.1", "LOCAL_CONTAINER_HOST": "10.0.0.5"}
    )
    assert chosen == ContainerAccess("10.0.0.5", "172.17.0.1")
    assert chosen.host_is_address
    assert not ContainerAccess(HOST, "127.0.0.1").host_is_address


# --- written when the stack starts, removed when it stops ---------------------------------------------
@dataclass
class _RunningStack:
    """What SamEnvironment reads of a running LocalStack."""

    template: Template
    options: StackOptions
    endpoints: Endpoints = STACK_ENDPOINTS
    functions: dict[str, object] = field(default_factory=dict)


def test_the_files_are_written_at_start_and_removed_at_stop(tmp_path: Path) -> None:
    template = stack_template("dynamodb")
    running = _RunningStack(template, StackOptions(data_dir=tmp_path))
    running.functions = dict.fromkeys(stack_functions(template))
    sam = SamEnvironment(cast("LocalStack", running), ContainerAccess(HOST, "127.0.0.1"))

    sam.start()
    try:
        written = sorted(p.name for p in tmp_path.iterdir())
        env_vars = json.loads(sam.env_vars_path.read_text())
        container_env = json.loads(sam.container_env_path.read_text())
        command = sam.invoke_command("OrdersApiFunction", Path("events/api_create_order.json"))
    finally:
        sam.stop()

    assert written == ["sam-container-env.json", "sam-env.json"]  # no temporary file left behind
    assert sorted(env_vars) == sorted(running.functions)
    assert container_env["AWS_ENDPOINT_URL_SQS"] == "http://host.docker.internal:48002"
    assert command == (
        "sam local invoke OrdersApiFunction -e events/api_create_order.json "
        f"--env-vars {sam.env_vars_path} --container-env-vars {sam.container_env_path} "
        f"--debug-port {DEBUG_PORT} --add-host host.docker.internal:host-gateway"
    )
    assert list(tmp_path.iterdir()) == []
