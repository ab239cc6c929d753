"""No listener, renderer or hook can stop a poller; a supervised thread that fails is reported at once and
restarted, and one that keeps failing stops for good and says so (tools/local/supervision.py)."""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Callable
from typing import Any, cast

import boto3
import pytest

from tests.support.outbox_corpus import LONG_INTEGER, corpus
from tools.local.console.activity import ActivityLog, Entry, Invocation, Notice
from tools.local.console.render import Console
from tools.local.pollers.destinations import FailureDestinations
from tools.local.pollers.event_sources import StreamSource
from tools.local.pollers.stream_poller import StreamPoller
from tools.local.pollers.threads import MappingThreads
from tools.local.runtime.functions import FunctionRuntime, InvocationResult
from tools.local.supervision import SupervisedThread
from tools.local.tests.test_console_render import STREAM_ARN, stream_record

WAIT_SECONDS = 5.0


def eventually(condition: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {WAIT_SECONDS:g} s"
        time.sleep(0.01)


class Failing(SupervisedThread):
    """Fails its first `failures` runs, then runs until stopped."""

    first_pause_seconds = 0.01

    def __init__(self, failures: int) -> None:
        super().__init__("failing")
        self.failures = failures
        self.runs = 0
        self.reports: list[str] = []
        self.report_failures_to(lambda name, what: self.reports.append(f"{name}: {what}"))

    def _run(self) -> None:
        self.runs += 1
        if self.runs <= self.failures:
            raise ValueError(f"run {self.runs} broke")
        self._stop.wait()


def test_a_thread_that_fails_is_reported_at_once_and_restarted_on_its_state() -> None:
    thread = Failing(failures=2)
    thread.start()
    try:
        eventually(lambda: thread.runs == 3, "the third run")
        health = thread.health()
        assert health.alive
        assert health.restarts == 2
        assert health.error == "ValueError: run 2 broke"
        assert thread.reports == [
            "failing: stopped by ValueError: run 1 broke; restarting it (failed 1 time(s) within 300 s)",
            "failing: stopped by ValueError: run 2 broke; restarting it (failed 2 time(s) within 300 s)",
        ]
        assert not thread.failed
    finally:
        thread.stop()
        thread.join(WAIT_SECONDS)
    assert not thread.failed, "stopped, not failed"


def test_a_thread_that_keeps_failing_stops_for_good_and_says_the_stack_has_failed() -> None:
    thread = Failing(failures=100)
    thread.max_restarts = 2
    thread.start()
    thread.join(WAIT_SECONDS)

    assert thread.failed
    assert thread.runs == 3
    assert thread.health().to_json() == {
        "name": "failing",
        "alive": False,
        "restarts": 2,
        "error": "ValueError: run 3 broke",
    }
    assert thread.reports[-1].endswith("failed 3 time(s) within 300 s: not restarted, the stack has failed")


def test_a_failing_batch_thread_is_reported_and_the_mapping_goes_on() -> None:
    class Mapping(MappingThreads):
        def _run(self) -> None:
            self._start_batch(self._batch, (), name="mapping-1")
            self._stop.wait()

        def _batch(self) -> None:
            raise KeyError("record")

    mapping = Mapping("mapping")
    reports: list[str] = []
    mapping.report_failures_to(lambda name, what: reports.append(what))
    mapping.start()
    try:
        eventually(lambda: reports, "the batch's report")
        assert reports == ["batch mapping-1 failed: KeyError: 'record'; its records are delivered again"]
        assert mapping.alive()
    finally:
        mapping.stop()
        mapping.join(WAIT_SECONDS)


# --- listeners --------------------------------------------------------------------------------------------
def an_invocation() -> Invocation:
    return Invocation(
        "OutboxRelayFunction", "dynamodb", "OrdersTable", {"Records": []}, InvocationResult("r")
    )


def test_a_listener_that_raises_never_reaches_the_thread_that_added_the_entry() -> None:
    log = ActivityLog()
    seen: list[Entry] = []

    def broken(entry: Entry) -> None:  # as the console's renderer once read a 5,000-digit integer
        if isinstance(entry, Invocation):
            json.loads("9" * 5000)

    log.subscribe(broken)
    log.subscribe(seen.append)

    log.add(an_invocation())  # as a poller's thread adds it: it must not raise

    (notice,) = log.notices()
    assert notice.level == "error"
    assert (
        "listener test_a_listener_that_raises_never_reaches_the_thread_that_added_the_entry.<locals>.broken"
        in (notice.message)
    )
    assert "failed on Invocation: ValueError: Exceeds the limit" in notice.message
    assert [type(e).__name__ for e in seen] == ["Invocation", "Notice"], (
        "the other listeners still hear of both"
    )


def test_a_listener_that_fails_on_its_own_failure_report_too_does_not_loop(
    capsys: pytest.CaptureFixture[str],
) -> None:
    log = ActivityLog()

    def always_broken(entry: Entry) -> None:
        raise RuntimeError(type(entry).__name__)

    log.subscribe(always_broken)
    log.add(an_invocation())

    assert len(log.notices()) == 1
    assert "failed on Notice: RuntimeError: Notice" in capsys.readouterr().err


def test_a_stuck_terminal_holds_no_poller() -> None:
    """The console's stream blocks (a paused terminal): adding entries still returns at once."""
    release = threading.Event()

    class StuckStream(io.StringIO):
        def write(self, text: str) -> int:
            release.wait(WAIT_SECONDS)
            return super().write(text)

    console = Console(StuckStream(), color=False)
    log = ActivityLog()
    log.subscribe(console.on_entry)
    try:
        began = time.monotonic()
        for _ in range(100):
            log.add(an_invocation())
        assert time.monotonic() - began < 1.0
    finally:
        release.set()
        console.flush(WAIT_SECONDS)


def test_a_terminal_that_fails_is_reported_and_printing_resumes() -> None:
    class FlakyStream(io.StringIO):
        failures = 1

        def write(self, text: str) -> int:
            if self.failures:
                self.failures -= 1
                raise OSError("EIO")
            return super().write(text)

    stream = FlakyStream()
    console = Console(stream, color=False)
    console.printer.first_pause_seconds = 0.01
    reports: list[str] = []
    console.printer.report_failures_to(lambda name, what: reports.append(what))
    poison = next(p for p in corpus() if p.name == LONG_INTEGER)

    console.on_entry(Notice("error", "first", "lost with the failed write"))
    console.on_entry(Notice("error", "second", f"then {poison.dynamodb}"[:200]))
    console.flush(WAIT_SECONDS)

    assert reports == ["stopped by OSError: EIO; restarting it (failed 1 time(s) within 300 s)"]
    assert "then {'S':" in stream.getvalue()
    assert console.printer.health().restarts == 1


# --- a poller, with the console and a broken listener ------------------------------------------------------
class Shard:
    """A stream of one shard (DescribeStream, GetShardIterator, GetRecords) handing out `records` once."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.records = records

    def describe_stream(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"Shards": [{"ShardId": "shardId-1", "SequenceNumberRange": {"StartingSequenceNumber": "1"}}]}

    def get_shard_iterator(self, **_: Any) -> dict[str, str]:
        return {"ShardIterator": "iterator"}

    def get_records(self, iterator: str) -> tuple[list[dict[str, Any]], str | None]:
        records, self.records = self.records, []
        return records, iterator

    def close(self) -> None:
        pass


class Relay:
    """The relay's answer to every batch: nothing failed."""

    physical_name = "local-OutboxRelayFunction"

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def invoke(self, event: dict[str, Any], throttle: bool = False) -> InvocationResult:
        self.batches.append([r["dynamodb"]["NewImage"]["eventId"]["S"] for r in event["Records"]])
        return InvocationResult("r", payload={"batchItemFailures": []})


def test_no_record_and_no_listener_stops_a_stream_poller() -> None:
    """The reproduced bug: the console's renderer raised inside the poller's thread on a 5,000-digit integer,
    and the table's stream was never read again. Now every corpus record goes through, a broken listener
    too, and the poller reads on."""
    poisons = corpus()
    records = [stream_record(poison, f"{index:021d}") for index, poison in enumerate(poisons, start=1)]
    shard = Shard(records)
    activity = ActivityLog()
    console = Console(io.StringIO(), color=False)
    activity.subscribe(console.on_entry)
    activity.subscribe(lambda entry: json.loads("9" * 5000))  # a listener as broken as the renderer was
    relay = Relay()
    poller = StreamPoller(
        StreamSource(function="OutboxRelayFunction", name="OrdersOutbox", table="OrdersTable"),
        cast(FunctionRuntime, relay),
        STREAM_ARN,
        boto3.client("dynamodbstreams", endpoint_url="http://127.0.0.1:9", region_name="us-east-1"),
        cast(FailureDestinations, None),
        activity,
    )
    poller._reader = cast(Any, shard)
    poller._streams = cast(Any, shard)
    poller.start()
    try:
        eventually(lambda: relay.batches, "the corpus's batch")
        later = corpus()[0]
        shard.records = [stream_record(later, "000000000000000009999")]  # a record written after them
        eventually(lambda: len(relay.batches) == 2, "the record written after them")
        assert poller.alive()
        assert poller.health().restarts == 0
    finally:
        poller.stop()
        poller.join(WAIT_SECONDS)
    console.flush(WAIT_SECONDS)
    assert relay.batches == [[poison.event_id for poison in poisons], [later.event_id]]
