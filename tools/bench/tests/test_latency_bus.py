"""The bus of the relays at AWS latency (tools/bench/latency_bus.py), served by a process of its own: it
answers PutEvents through a real boto3 client after its latency, accepts every entry, records what it
received, answers concurrent calls concurrently, counts events out of their order's sequence and an
order's events in flight twice, is driven through control paths never taken for a PutEvents, and dies with
the process that started it."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from tools.bench.latency_bus import (
    ROOT,
    Call,
    Entry,
    LatencyBus,
    in_flight_twice,
    out_of_order,
    peak_in_flight,
)


@pytest.fixture
def bus(fake_credentials: None) -> Iterator[LatencyBus]:
    with LatencyBus() as running:
        yield running


def client(bus: LatencyBus) -> Any:
    return boto3.client(
        "events",
        endpoint_url=bus.endpoint,
        region_name="us-east-1",
        config=Config(retries={"max_attempts": 1}, max_pool_connections=8),
    )


def entry(order: str, sequence: int) -> dict[str, str]:
    envelope = {"specversion": "1.0", "id": f"{order}-{sequence}", "subject": order, "sequence": sequence}
    return {"Source": "shop.orders", "DetailType": "OrderCreated", "Detail": json.dumps(envelope)}


def raw_request(
    bus: LatencyBus, method: str, path: str, body: dict[str, Any] | None = None, **headers: str
) -> tuple[int, dict[str, Any]]:
    """A request to the bus as it comes, without LatencyBus's control client: (status, JSON answer)."""
    address = urlsplit(bus.endpoint)
    connection = http.client.HTTPConnection(address.hostname or "", address.port, timeout=10)
    try:
        payload = None if body is None else json.dumps(body).encode()
        connection.request(method, path, body=payload, headers=headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie, ended but not yet reaped by its new parent, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def test_put_events_is_answered_after_the_latency_and_every_entry_recorded(bus: LatencyBus) -> None:
    bus.latency_seconds = 0.05
    events = client(bus)

    began = time.perf_counter()
    response = events.put_events(Entries=[entry("o-1", 1), entry("o-2", 1)])
    took = time.perf_counter() - began

    assert took >= 0.05
    assert response["FailedEntryCount"] == 0
    assert len(response["Entries"]) == 2
    assert all(answer["EventId"] for answer in response["Entries"])
    (call,) = bus.calls()
    assert call.answered is not None
    assert call.answered - call.arrived >= 0.05
    assert [(e.order, e.sequence, e.event_id) for e in call.entries] == [
        ("o-1", 1, "o-1-1"),
        ("o-2", 1, "o-2-1"),
    ]
    assert json.loads(call.entries[0].detail)["subject"] == "o-1"


def test_the_latency_is_the_one_set_last(fake_credentials: None) -> None:
    with LatencyBus(0.3) as bus:
        events = client(bus)
        began = time.perf_counter()
        events.put_events(Entries=[entry("o-1", 1)])
        slow = time.perf_counter() - began

        bus.latency_seconds = 0.0
        began = time.perf_counter()
        events.put_events(Entries=[entry("o-1", 2)])
        fast = time.perf_counter() - began

    assert slow >= 0.3
    assert fast < 0.3
    assert bus.latency_seconds == 0.0


def test_other_operations_are_refused_as_unknown(bus: LatencyBus) -> None:
    with pytest.raises(ClientError) as refused:
        client(bus).list_event_buses()

    assert refused.value.response["Error"]["Code"] == "UnknownOperationException"
    assert bus.calls() == []


def test_concurrent_calls_are_answered_concurrently(bus: LatencyBus) -> None:
    # Each call waits a second: four at once overlap however busy the machine is.
    bus.latency_seconds = 1.0
    events = client(bus)

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda n: events.put_events(Entries=[entry(f"o-{n}", 1)]), range(4)))

    assert all(answer["FailedEntryCount"] == 0 for answer in answers)
    figures = bus.figures()
    assert figures["calls"] == figures["entries"] == figures["distinct_events"] == 4
    assert figures["peak_calls_in_flight"] >= 2
    assert figures["in_flight_twice"] == 0  # four different orders


def test_an_orders_events_in_two_calls_at_once_are_counted_in_flight_twice(bus: LatencyBus) -> None:
    # Each call waits a second: the second arrives while the first is unanswered.
    bus.latency_seconds = 1.0
    events = client(bus)

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda n: events.put_events(Entries=[entry("o-1", n), entry(f"o-{n + 1}", 1)]), (1, 2)))

    figures = bus.figures()
    assert figures["calls"] == 2
    assert figures["in_flight_twice"] == 1  # o-1's event in the later call; o-2 and o-3 once each
    assert figures["peak_calls_in_flight"] == 2


def test_an_inversion_received_by_the_bus_is_counted(bus: LatencyBus) -> None:
    events = client(bus)

    events.put_events(Entries=[entry("o-1", 2), entry("o-2", 1)])
    events.put_events(Entries=[entry("o-1", 1), entry("o-2", 2)])  # o-1's first event after its second

    assert bus.figures()["out_of_order"] == 1


def test_reset_forgets_what_was_received_and_keeps_the_latency(bus: LatencyBus) -> None:
    bus.latency_seconds = 0.1
    events = client(bus)
    events.put_events(Entries=[entry("o-1", 2)])

    bus.reset()

    assert bus.figures() == {
        "calls": 0,
        "entries": 0,
        "distinct_events": 0,
        "out_of_order": 0,
        "in_flight_twice": 0,
        "peak_calls_in_flight": 0,
    }
    assert bus.calls() == []
    began = time.perf_counter()
    events.put_events(Entries=[entry("o-1", 1)])  # lower than before the reset: not out of order now
    assert time.perf_counter() - began >= 0.1
    assert (bus.figures()["calls"], bus.figures()["out_of_order"]) == (1, 0)


def test_control_paths_and_put_events_are_never_taken_for_one_another(bus: LatencyBus) -> None:
    events = client(bus)
    events.put_events(Entries=[entry("o-1", 1)])
    put_events = {"X-Amz-Target": "AWSEvents.PutEvents", "Content-Type": "application/x-amz-json-1.1"}

    # A PutEvents on a control path: refused, and neither recorded nor a reset.
    status, answer = raw_request(bus, "POST", "/_control/reset", {"Entries": [entry("o-2", 1)]}, **put_events)
    assert status == 400
    assert "control path" in answer["error"]
    at_control: Any = boto3.client(  # the same through botocore, its endpoint under /_control/
        "events",
        endpoint_url=f"{bus.endpoint}/_control/latency",
        region_name="us-east-1",
        config=Config(retries={"max_attempts": 1}),
    )
    with pytest.raises(ClientError):
        at_control.put_events(Entries=[entry("o-3", 1)])
    # A control request off the control paths: an unknown operation, the latency unchanged.
    status, answer = raw_request(bus, "POST", "/", {"latency_seconds": 5})
    assert (status, answer["__type"]) == (400, "UnknownOperationException")
    began = time.perf_counter()
    events.put_events(Entries=[entry("o-1", 2)])
    assert time.perf_counter() - began < 5
    # Unknown control paths and unreadable latencies are refused; reading the figures is no call.
    assert raw_request(bus, "POST", "/_control/nothing")[0] == 404
    assert raw_request(bus, "GET", "/_control/reset")[0] == 404
    assert raw_request(bus, "POST", "/_control/latency", {"latency_seconds": -1})[0] == 400
    assert raw_request(bus, "POST", "/_control/latency", {"seconds": 1})[0] == 400
    assert raw_request(bus, "GET", "/_control/figures")[1]["calls"] == 2
    assert [entry.order for entry in bus.received()] == ["o-1", "o-1"]


def test_the_bus_runs_in_a_process_of_its_own_gone_after_the_block(fake_credentials: None) -> None:
    with LatencyBus() as bus:
        pid = bus.pid
        assert pid is not None
        assert pid != os.getpid()
        assert alive(pid)
        client(bus).put_events(Entries=[entry("o-1", 1)])

    assert not alive(pid)
    assert bus.pid is None
    with pytest.raises(RuntimeError, match="not serving"):
        _ = bus.endpoint


def test_the_bus_dies_with_the_process_that_started_it_when_that_one_is_killed() -> None:
    # A parent that starts the bus, says its pid and waits: killed, it cannot stop the bus itself.
    script = "import time; from tools.bench.latency_bus import LatencyBus; bus = LatencyBus().start(); "
    script += "print(bus.pid, flush=True); time.sleep(120)"
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, cwd=ROOT)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert alive(child)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()

    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)


def test_out_of_order_counts_lower_sequences_only() -> None:
    received = [("a", 1), ("a", 3), ("a", 2), ("b", 1), ("a", 3), ("a", 1), (None, None), ("b", 2)]

    # a:2 after a:3, a:1 after a:3; a repeated a:3 is not lower; entries without an order count for nothing.
    assert out_of_order(received) == 2
    assert out_of_order([("a", 1), ("a", 2), ("a", 3)]) == 0


def _call(index: int, arrived: float, answered: float | None, *orders: str) -> Call:
    return Call(index, arrived, [Entry("{}", order, 1, None) for order in orders], answered)


def test_an_orders_event_sent_while_its_earlier_call_is_unanswered_is_in_flight_twice() -> None:
    calls = [
        _call(0, 0.0, 1.0, "a", "b"),
        _call(1, 0.5, 1.5, "a", "c"),  # a is still in flight in call 0
        _call(2, 1.2, 2.0, "b"),  # call 0 was answered at 1.0
        _call(3, 1.4, None, "c"),  # call 1 is in flight (answered at 1.5)
    ]

    assert in_flight_twice(calls) == 2
    assert peak_in_flight(calls) == 3  # calls 1, 2 and 3 from 1.4


def test_entries_whose_detail_is_no_envelope_are_kept_without_an_order(bus: LatencyBus) -> None:
    client(bus).put_events(Entries=[{"Source": "s", "DetailType": "t", "Detail": '"not an object"'}])

    (received,) = bus.received()
    assert (received.order, received.sequence) == (None, None)
    assert bus.figures()["out_of_order"] == 0
