"""The docker-free local stack: services, resources, functions, event sources and the API, from template.yaml.

    with LocalStack() as stack:          # or stack.start() ... stack.stop()
        stack.api_url, stack.clients.sqs(), stack.activity.invocations("OutboxRelayFunction")

Start-up order keeps failures fast and leaves nothing behind: the API port is bound first, then
DynamoDB Local and moto are launched, the function environments start their init meanwhile, the
resources are provisioned, and only then do pollers and the API start serving.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from tools.local.console.activity import ActivityLog, invoke_directly
from tools.local.console.render import Console
from tools.local.console.reports import FunctionReports
from tools.local.gateway.lambda_api import LambdaApi
from tools.local.gateway.server import LAMBDA_API_PREFIX, LOCAL_PREFIX, ApiServer, RouteTable
from tools.local.inspector.api import inspector_for
from tools.local.pollers.checkpoints import CheckpointStore
from tools.local.pollers.destinations import FailureDestinations
from tools.local.pollers.event_sources import IMPLICIT_API, EventSources, read_event_sources
from tools.local.pollers.queue_poller import QueuePoller
from tools.local.pollers.scheduler import SchedulePoller
from tools.local.pollers.stream_poller import StreamPoller
from tools.local.processes import StartupError
from tools.local.reader.permissions import tables_written
from tools.local.runtime.functions import (
    FunctionError,
    FunctionRuntime,
    InvocationResult,
    default_max_concurrency,
    function_environment,
)
from tools.local.runtime.launchers import ForkServer, Launcher, shared_environment
from tools.local.services.custom_resources import create_custom_resources, custom_resources, service_function
from tools.local.services.emulators import AwsClients, Endpoints, LocalServices
from tools.local.services.order_database import DatabaseLocation
from tools.local.services.provisioning import SEED_FILE, Provisioner, ProvisioningReport
from tools.local.services.topics import TopicWatcher
from tools.local.supervision import SupervisedThread, ThreadHealth
from tools.template import ROOT, Template

DEFAULT_DATA_DIR = ROOT / ".local-data"
ORDER_DATABASE = "OrderDatabase"  # the nested application of OrderStore=postgres
_JOIN_SECONDS = 3.0
_WAIT_POLL_SECONDS = 0.1
T = TypeVar("T")


def stood_in_for(template: Template) -> dict[str, str]:
    """The resources of `template` the local stack stands in for besides what it provisions, with how: the
    order database's nested application (OrderStore=postgres), and each custom resource, whose function
    gets its Create request at start-up as CloudFormation would send it (custom_resources.py)."""
    stood_in = {}
    if ORDER_DATABASE in template.resources and template.is_created(ORDER_DATABASE):
        stood_in[ORDER_DATABASE] = (
            "a database of the embedded PostgreSQL server, its outputs as the nested stack's"
        )
    for logical_id in custom_resources(template):
        function = service_function(template, logical_id)
        stood_in[logical_id] = f"{function} gets its Create request at start-up, as from CloudFormation"
    return stood_in


@dataclass
class StackOptions:
    api_port: int = 3000  # 0: any free port
    dynamodb_port: int = 0  # 0: any free port
    moto_port: int = 0
    data_dir: Path = DEFAULT_DATA_DIR  # logs, and the DynamoDB files when persisting
    persist: bool = False
    seed_file: Path | None = SEED_FILE
    echo_function_logs: bool = False
    serve: bool = True  # False: resources and functions only (no pollers, no API), e.g. for one invoke
    only_functions: frozenset[str] | None = None  # start only these functions' environments
    # Fork function workers from one process that imported the shared packages (fast start-up);
    # False starts each in a fresh interpreter.
    fork_server: bool = True
    # Added to every function's environment (harnesses: e.g. LOCAL_WORKER_PRELOAD for fault injection).
    function_environment: dict[str, str] = field(default_factory=dict)
    # Execution environments per function (concurrent invocations) when the template reserves no
    # concurrency for it (ReservedConcurrentExecutions); default LOCAL_MAX_CONCURRENCY, else 4.
    max_concurrency: int = field(default_factory=default_max_concurrency)
    # Scheduled functions' periods multiplied by this (tests: 0.05 makes a minute 3 s).
    schedule_time_scale: float = 1.0

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "logs"


@dataclass
class StartupReport:
    seconds: float = 0.0
    provisioning: ProvisioningReport = field(default_factory=ProvisioningReport)
    init_errors: dict[str, FunctionError] = field(default_factory=dict)
    functions_not_emulated: list[str] = field(default_factory=list)
    auth_not_enforced: list[str] = field(default_factory=list)
    custom_resources: dict[str, Any] = field(default_factory=dict)  # each one's response Data


class LocalStack:
    def __init__(
        self,
        template: Template | None = None,
        options: StackOptions | None = None,
        *,
        services: LocalServices | None = None,
        console: Console | None = None,
    ) -> None:
        self.template = template or Template.load()
        self.options = options or StackOptions()
        self._owns_services = services is None
        self.services = services or LocalServices(
            self.options.log_dir,
            dynamodb_port=self.options.dynamodb_port,
            moto_port=self.options.moto_port,
            dynamodb_data_dir=self.options.data_dir / "dynamodb" if self.options.persist else None,
        )
        self.clients = AwsClients(self.services.endpoints)
        self.activity = ActivityLog()
        # What the functions say about each record in their own log lines (why it failed, parked, ignored).
        self.reports = FunctionReports()
        self.sources: EventSources = read_event_sources(self.template)
        self.console = console
        if console is not None:
            console.use_reports(self.reports, frozenset(s.function for s in self.sources.schedules))
            console.printer.report_failures_to(self._thread_failed)
            self.activity.subscribe(console.on_entry)
        self.report = StartupReport()
        self.functions: dict[str, FunctionRuntime] = {}
        self.api: ApiServer | None = None
        self._pollers: list[StreamPoller | QueuePoller | SchedulePoller | TopicWatcher] = []
        self._stream_arns: dict[str, str] = {}
        self._queue_urls: dict[str, str] = {}
        self._fork_server: ForkServer | None = None
        self._provisioner: Provisioner | None = None
        self._order_database: DatabaseLocation | None = None

    # --- lifecycle --------------------------------------------------------------------------------
    def __enter__(self) -> LocalStack:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start everything; on failure, stop what was started and raise (StartupError: the usual causes)."""
        began = time.monotonic()
        try:
            self._start(began)
        except BaseException:
            self.stop()
            raise

    def _start(self, began: float) -> None:
        stages = self._api_stages()
        self._stand_in_for_applications()
        self._create_functions()
        served = [route for route in self.sources.routes if route.function in self.functions]
        routes = RouteTable(served, stages)  # a route conflict fails before anything starts
        if self.options.serve and served:
            api_ids = {api: self.template.physical_name(api) for api in stages}
            self.api = ApiServer(
                routes,
                self.functions,
                api_ids,
                self.activity,
                self.options.api_port,
                # The operator commands invoke the order database's maintenance function at the Lambda API.
                {
                    LOCAL_PREFIX: inspector_for(self),
                    LAMBDA_API_PREFIX: LambdaApi(self.functions, self.activity),
                },
            )
        if self._owns_services:
            self.services.launch()
        if self._fork_server is not None:
            self._fork_server.start()
        # Function inits (imports) run while the services come up and resources are created.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="init") as pool:
            inits = pool.submit(self._start_functions)
            if self._owns_services:
                self.services.wait_ready()
            provisioner = Provisioner(self.template, self.clients, stood_in_for(self.template))
            self._provisioner = provisioner
            self.report.provisioning = provisioner.provision(self.options.seed_file)
            if self._order_database is not None:
                self._store_database_secret(self._order_database)
            inits.result()
        self._queue_urls = {q: provisioner.queue_url(q) for q in self.template.of_type("AWS::SQS::Queue")}
        for logical_id, runtime in self.functions.items():
            error = runtime.wait_ready()
            if error is not None:
                self.report.init_errors[logical_id] = error
        # What CloudFormation runs before the stack is complete: the order database's migrations.
        self.report.custom_resources = create_custom_resources(self.template, self.functions)
        if self.options.serve:
            if self.console is not None:
                self.console.printer.ensure_started()  # a supervised thread from now on (thread_health)
            self._start_event_sources()
            if self.api is not None:
                self.api.start()
        self.report.seconds = time.monotonic() - began

    def stop(self) -> None:
        """Stop everything this stack started; safe to call more than once."""
        if self.api is not None:
            self.api.stop()
            self.api = None
        for poller in self._pollers:
            poller.stop()
        for runtime in self.functions.values():
            runtime.stop()  # ends in-flight invocations, so pollers notice the stop at once
        if self._fork_server is not None:
            self._fork_server.stop()
        for poller in self._pollers:
            poller.join(_JOIN_SECONDS)
        self._pollers.clear()
        if self.console is not None:
            self.console.flush(_JOIN_SECONDS)  # the hop lines of what ran, before the stack says it stopped
        if self._owns_services:
            self.services.stop()
        else:
            self._drop_tables()
            if self._order_database is not None:
                with contextlib.suppress(Exception):  # the server may be gone already
                    self.services.order_database.drop(self.template.stack_name)

    def _drop_tables(self) -> None:
        """Delete the tables this stack created in services it borrowed (tests and chaos runs share them).

        DynamoDB Local runs every TTL sweep on one pool of 10 threads, each sweep 20 items a page with
        10 s between pages: tables left behind by finished stacks would starve the live ones' sweeps.
        """
        if self._provisioner is None:
            return
        dynamodb = self.clients.dynamodb()
        # Only the tables it created: another stack of the same name may be using existing ones.
        for logical_id in self._provisioner.created_tables:
            # Not there (a failed start) or the services are already gone: nothing to drop.
            with contextlib.suppress(ClientError, BotoCoreError):
                dynamodb.delete_table(TableName=self.template.physical_name(logical_id))

    # --- parts ------------------------------------------------------------------------------------
    def _stand_in_for_applications(self) -> None:
        """Nested applications the local stack stands in for: OrderDatabase (OrderStore=postgres) is a
        database of the embedded PostgreSQL server; its outputs feed the template as Aurora's would."""
        stood_in = stood_in_for(self.template)
        for logical_id in self.template.of_type("AWS::Serverless::Application"):
            if not self.template.is_created(logical_id):
                continue
            if logical_id not in stood_in:
                self.report.functions_not_emulated.append(f"{logical_id}: nested application not emulated")
                continue
            self._order_database = self.services.order_database.database(self.template.stack_name)
            self.template.application_outputs[logical_id] = self._order_database.outputs()

    def _api_stages(self) -> dict[str, str]:
        stages = {IMPLICIT_API: "Prod"}
        for api in self.template.of_type("AWS::Serverless::Api"):
            props = self.template.properties(api)
            stages[api] = str(props.get("StageName", "Prod"))
            authorizer = (props.get("Auth") or {}).get("DefaultAuthorizer")
            if authorizer:
                self.report.auth_not_enforced.append(f"{api} ({authorizer})")
        return stages

    def _store_database_secret(self, database: DatabaseLocation) -> None:
        """The order database's password secret, as Aurora's ManageMasterUserPassword creates it."""
        secrets = self.clients.secrets()
        try:
            secrets.create_secret(Name=database.secret_name, SecretString=database.secret_string())
        except secrets.exceptions.ResourceExistsException:  # a persisted stack started again
            secrets.put_secret_value(SecretId=database.secret_name, SecretString=database.secret_string())

    def _create_functions(self) -> None:
        specs = {}
        for logical_id, spec in self.template.functions().items():
            if not self.template.is_created(logical_id):
                continue
            if self.options.only_functions is not None and logical_id not in self.options.only_functions:
                continue
            if not spec.runtime.startswith("python3"):
                self.report.functions_not_emulated.append(
                    f"{logical_id}: runtime {spec.runtime!r} is not Python"
                )
                continue
            if spec.external_layers:
                self.report.functions_not_emulated.append(
                    f"{logical_id}: layers {', '.join(spec.external_layers)} are not available locally"
                )
            specs[logical_id] = spec
        environments = {
            logical_id: {
                **function_environment(spec, self.template.physical_name(logical_id), self.endpoints),
                **self.options.function_environment,
            }
            for logical_id, spec in specs.items()
        }
        launcher: Launcher | None = None
        if self.options.fork_server and len(specs) > 1:
            # Shared packages are imported once, with the environment all functions have in common;
            # LAMBDA_TASK_ROOT only marks "in Lambda" for packages that look at it on import.
            shared = shared_environment(list(environments.values()))
            shared.setdefault("LAMBDA_TASK_ROOT", str(ROOT / "functions"))
            self._fork_server = ForkServer(shared, self.options.log_dir / "forkserver.log")
            launcher = self._fork_server
        for logical_id, spec in specs.items():
            self.functions[logical_id] = FunctionRuntime(
                spec,
                self.template.physical_name(logical_id),
                environments[logical_id],
                self.options.log_dir / f"{logical_id}.log",
                echo=self._on_log_line,
                tracing=self._tracing(logical_id),
                launcher=launcher,
                max_concurrency=(
                    spec.reserved_concurrency
                    if spec.reserved_concurrency is not None
                    else self.options.max_concurrency
                ),
            )

    def _start_functions(self) -> None:
        for runtime in self.functions.values():
            runtime.start()

    def _tracing(self, logical_id: str) -> bool:
        mode = self.template.properties(logical_id).get("Tracing", self._global("Tracing"))
        return str(mode) in {"Active", "PassThrough"}

    def _global(self, name: str) -> Any:
        return self.template.resolve(self.template.data.get("Globals", {}).get("Function", {}).get(name))

    def _on_log_line(self, function: str, line: str) -> None:
        """Each line a function writes, from its log pump's thread (neither call raises): the reports it
        makes, and the line itself on the console with LOGS=1."""
        self.reports.on_log_line(function, line)
        if self.options.echo_function_logs and self.console is not None:
            self.console.post(self.console.paint(f"    {function} | {line}", "\033[2m"))

    def _thread_failed(self, thread: str, what: str) -> None:
        """A supervised thread's failure (tools/local/supervision.py): at once on the console, as an error."""
        self.activity.notice("error", "threads", f"thread {thread} {what}", {"thread": thread})

    def _start_event_sources(self) -> None:
        sqs = self.clients.sqs()
        destinations = FailureDestinations(self.clients.sqs(), self.clients.sns())
        checkpoints = (
            CheckpointStore(self.options.data_dir / "stream-checkpoints.json")
            if self.services.persistent
            else None
        )
        # Which tables each function may write (None: cannot tell): only their invocations wake a
        # mapping of that table's stream; the others' could not have written it.
        writes = {function: tables_written(self.template, function) for function in self.functions}
        for stream in self.sources.streams:
            if not stream.enabled or stream.function not in self.functions:
                continue
            woken_by = frozenset(
                f for f, tables in writes.items() if tables is None or stream.table in tables
            )
            self._pollers.append(
                StreamPoller(
                    stream,
                    self.functions[stream.function],
                    self.stream_arn(stream.table),
                    self.clients.streams(),
                    destinations,
                    self.activity,
                    checkpoints,
                    woken_by,
                )
            )
        for queue in self.sources.queues:
            if not queue.enabled or queue.function not in self.functions:
                continue
            self._pollers.append(
                QueuePoller(
                    queue,
                    self.functions[queue.function],
                    self._queue_urls[queue.queue],
                    self.template.arn(queue.queue),
                    self.clients.sqs(),
                    self.activity,
                )
            )
        for schedule in self.sources.schedules:
            if schedule.enabled and schedule.function in self.functions:
                self._pollers.append(
                    SchedulePoller(
                        schedule,
                        self.functions[schedule.function],
                        self.activity,
                        self.options.schedule_time_scale,
                    )
                )
        for topic, queue_url in self.report.provisioning.console_queues.items():
            self._pollers.append(TopicWatcher(topic, queue_url, sqs, self.activity))
        for poller in self._pollers:
            poller.report_failures_to(self._thread_failed)
            poller.start()

    # --- for people and tests ---------------------------------------------------------------------
    def threads(self) -> list[SupervisedThread]:
        """The stack's supervised threads: each poller and topic watcher, and the console's printer."""
        found: list[SupervisedThread] = list(self._pollers)
        if self.console is not None:
            found.append(self.console.printer)
        return found

    def thread_health(self) -> list[ThreadHealth]:
        """Each supervised thread's health (GET /_local/api/health)."""
        return [thread.health() for thread in self.threads()]

    def failed_threads(self) -> list[ThreadHealth]:
        """The threads that failed too often to be restarted: the stack has failed (make local exits 1)."""
        return [thread.health() for thread in self.threads() if thread.failed]

    @property
    def endpoints(self) -> Endpoints:
        return self.services.endpoints

    @property
    def api_url(self) -> str:
        if self.api is None:
            raise StartupError("the local API is not running (no Api events, or not serving)")
        return self.api.url

    @property
    def inspector_url(self) -> str:
        """The local inspector's page (orders, each one's timeline, queues, redrive), served by the API."""
        return f"{self.api_url}{LOCAL_PREFIX}/"

    @property
    def order_database(self) -> DatabaseLocation:
        """OrderStore=postgres: the stack's database on the embedded server (connect() for a session)."""
        if self._order_database is None:
            raise StartupError("this stack has no order database (OrderStore is not postgres)")
        return self._order_database

    def stream_arn(self, table: str) -> str:
        """The real (DynamoDB Local) stream ARN of a table of the template."""
        if table not in self._stream_arns:
            description = self.clients.dynamodb().describe_table(TableName=self.template.physical_name(table))
            arn = description["Table"].get("LatestStreamArn")
            if arn is None:
                raise StartupError(f"table {table} has no stream")
            self._stream_arns[table] = arn
        return self._stream_arns[table]

    def queue_url(self, queue: str) -> str:
        return self._queue_urls[queue]

    def capture_queue_url(self, topic: str) -> str:
        """The queue that receives a copy of everything published to a topic of the template."""
        return self.report.provisioning.capture_queues[topic]

    def invoke(self, function: str, event: Any) -> InvocationResult:
        """Invoke a function directly (like `aws lambda invoke`), recorded in the activity log."""
        return invoke_directly(self.functions[function], self.activity, event, "invoke")

    def wait_for(self, condition: Callable[[], T | None], timeout: float, what: str) -> T:
        """Wait until condition() returns something truthy and return it; TimeoutError after `timeout` s."""
        deadline = time.monotonic() + timeout
        while True:
            value = condition()
            if value:
                return value
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{what}: not within {timeout:g} s")
            # Most conditions change with new activity; the poll interval covers the others.
            self.activity.wait_for_change(min(remaining, _WAIT_POLL_SECONDS))

    def child_pids(self) -> list[int]:
        pids = [pid for runtime in self.functions.values() for pid in runtime.child_pids()]
        if self._fork_server is not None:
            pids += self._fork_server.child_pids()
        if self._owns_services:
            pids += self.services.child_pids()
        return pids
