"""The local stack's saga capacity: the highest offered rate at which orders keep reaching CONFIRMED.

A ramp of steps (BENCH_RAMP, orders/s, each BENCH_STEP_SECONDS long). Each step is offered open-loop by
a load generator in a process of its own (`python -m tools.bench.capacity generate URL RATE SECONDS`), so
its CPU is not the stack's. A step keeps up when
- every accepted order reaches CONFIRMED and every consumer queue is empty again within a bounded drain
  (BENCH_DRAIN_SECONDS) after the last POST: no backlog left behind;
- POST -> CONFIRMED does not grow over the step: the median of its last third is at most 1.25 times that
  of its first third, plus 100 ms (a backlog that grows shows as latency growing with it; at 40 orders/s
  a first run went from 2.5 s to 4.8 s within 20 s and passed a 2x bound, which is no way to keep up);
- the generator achieved at least 95% of the offered rate with no failed POST.
The ramp stops at the first step that does not keep up; the capacity is the last rate that did.

CPU per order by process comes from /proc/<pid>/stat (utime + stime) before and after each step, over
the step and its drain: DynamoDB Local, moto server, each function's workers, the fork server, and the
stack's own process (pollers, local API, log pumps and activity listeners: they are threads of it).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable
from typing import Any

from tools.bench.latency import offer_at_rate
from tools.local.console.activity import Invocation
from tools.local.stack import LocalStack

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_CONFIRMING_FUNCTION = "OrderStatusFunction"
_CONFIRMING_EVENT = "InventoryReserved"
_CONSUMER_QUEUES = ("InventoryQueue", "OrderStatusQueue", "NotificationQueue")
# Growth allowed between the first and last third of a step before it counts as a growing backlog.
_GROWTH_FACTOR = 1.25
_GROWTH_SLACK_SECONDS = 0.1


def process_cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process (its threads included), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    # Fields after the command name start at field 3 (state): utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def stack_processes(stack: LocalStack) -> dict[int, str]:
    """The stack's processes by pid, each with the name its CPU is reported under."""
    named: dict[int, str] = {os.getpid(): "stack (pollers, API, log pumps)"}
    services = stack.services
    if services.dynamodb.process is not None:
        named[services.dynamodb.process.pid] = "DynamoDB Local"
    if services.moto.process is not None:
        named[services.moto.process.pid] = "moto server"
    if stack._fork_server is not None:
        for pid in stack._fork_server.child_pids():
            named[pid] = "fork server"
    for logical_id, runtime in stack.functions.items():
        for pid in runtime.child_pids():
            named[pid] = f"{logical_id} workers"
    return named


class CpuMeter:
    """CPU seconds by process name between start() and stop(); workers started meanwhile count from 0."""

    def __init__(self, stack: LocalStack) -> None:
        self._stack = stack
        self._names: dict[int, str] = {}
        self._before: dict[int, float] = {}
        self._last: dict[int, float] = {}

    def start(self) -> None:
        self._names = stack_processes(self._stack)
        self._before = {pid: cpu for pid in self._names if (cpu := process_cpu_seconds(pid)) is not None}
        self._last = dict(self._before)

    def sample(self) -> None:
        """Note new workers and the CPU of live processes (a worker replaced mid-step keeps what it used)."""
        for pid, name in stack_processes(self._stack).items():
            self._names.setdefault(pid, name)
        for pid in self._names:
            cpu = process_cpu_seconds(pid)
            if cpu is not None:
                self._last[pid] = cpu

    def stop(self) -> dict[str, float]:
        self.sample()
        used: dict[str, float] = {}
        for pid, cpu in self._last.items():
            name = self._names[pid]
            used[name] = used.get(name, 0.0) + cpu - self._before.get(pid, 0.0)
        return used


class ConfirmationWatch:
    """When each order was confirmed (OrderStatusFunction handled its InventoryReserved), from the
    activity log's listener: kept cheap, it runs in the stack's threads."""

    def __init__(self, stack: LocalStack) -> None:
        self.confirmed_at: dict[str, float] = {}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        stack.activity.subscribe(self._on_entry)

    def _on_entry(self, entry: object) -> None:
        if not isinstance(entry, Invocation) or entry.function != _CONFIRMING_FUNCTION:
            return
        failed = set(entry.failed_ids)
        found = []
        for record in entry.records:
            if record.get("messageId") in failed:
                continue
            try:
                event = json.loads(record["body"])["detail"]
            except (KeyError, TypeError, ValueError):
                continue
            if event.get("type") == _CONFIRMING_EVENT:
                found.append(event["subject"])
        if found:
            with self._changed:
                for order_id in found:
                    self.confirmed_at.setdefault(order_id, entry.at)
                self._changed.notify_all()

    def wait_for(self, orders: Iterable[str], deadline: float) -> bool:
        wanted = set(orders)
        with self._changed:
            while not wanted.issubset(self.confirmed_at):
                remaining = deadline - time.time()
                if remaining <= 0:
                    return False
                self._changed.wait(min(remaining, 0.2))
        return True


def _queue_depths(stack: LocalStack) -> dict[str, int]:
    sqs = stack.clients.sqs()
    depths = {}
    for queue in _CONSUMER_QUEUES:
        attributes = sqs.get_queue_attributes(
            QueueUrl=stack.queue_url(queue),
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        depths[queue] = int(attributes["ApproximateNumberOfMessages"]) + int(
            attributes["ApproximateNumberOfMessagesNotVisible"]
        )
    return depths


def _drained(stack: LocalStack, deadline: float) -> dict[str, int]:
    while True:
        depths = _queue_depths(stack)
        if not any(depths.values()) or time.time() >= deadline:
            return depths
        time.sleep(0.1)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def offer(api_url: str, sku: str, rate: float, seconds: float) -> dict[str, Any]:
    """Run the load generator process; its report: {"sent": {order_id: epoch}, "errors": [...], ...}."""
    completed = subprocess.run(
        [sys.executable, "-m", "tools.bench.capacity", "generate", api_url, sku, str(rate), str(seconds)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ},
    )
    report: dict[str, Any] = json.loads(completed.stdout)
    return report


def step(
    stack: LocalStack, watch: ConfirmationWatch, sku: str, rate: float, seconds: float, drain: float
) -> dict[str, Any]:
    """One step of the ramp: offered load, drain, and whether the stack kept up."""
    meter = CpuMeter(stack)
    load_before = os.getloadavg()[0]
    meter.start()
    report = offer(stack.api_url, sku, rate, seconds)
    sent: dict[str, float] = report["sent"]
    drain_deadline = time.time() + drain
    all_confirmed = watch.wait_for(sent, drain_deadline)
    depths = _drained(stack, drain_deadline)
    cpu = meter.stop()
    confirmed = {o: watch.confirmed_at[o] - at for o, at in sent.items() if o in watch.confirmed_at}
    by_send = [confirmed[o] for o, _ in sorted(sent.items(), key=lambda item: item[1]) if o in confirmed]
    third = max(1, len(by_send) // 3)
    first, last = by_send[:third], by_send[-third:]
    first_p50 = statistics.median(first) if first else float("nan")
    last_p50 = statistics.median(last) if last else float("nan")
    growing = not by_send or last_p50 > _GROWTH_FACTOR * first_p50 + _GROWTH_SLACK_SECONDS
    achieved = report["achieved_rate_per_s"]
    kept_up = (
        all_confirmed
        and not any(depths.values())
        and not growing
        and not report["errors"]
        and achieved >= 0.95 * rate
    )
    orders = max(1, len(confirmed))
    values = list(confirmed.values())
    return {
        "offered_rate_per_s": rate,
        "achieved_rate_per_s": achieved,
        "orders_accepted": len(sent),
        "orders_confirmed": len(confirmed),
        "errors": report["errors"][:10],
        "kept_up": kept_up,
        "queue_depths_after_drain": depths,
        "confirmed_p50_ms": 1000 * percentile(values, 0.5) if values else None,
        "confirmed_p99_ms": 1000 * percentile(values, 0.99) if values else None,
        "confirmed_p50_first_third_ms": 1000 * first_p50,
        "confirmed_p50_last_third_ms": 1000 * last_p50,
        "cpu_ms_per_order": {name: 1000 * s / orders for name, s in sorted(cpu.items())},
        "cpu_ms_per_order_total": 1000 * sum(cpu.values()) / orders,
        "load_average_before": load_before,
    }


def run(
    stack: LocalStack, sku: str, rates: list[float], step_seconds: float, drain_seconds: float
) -> dict[str, Any]:
    """The ramp, stopping at the first step that does not keep up."""
    watch = ConfirmationWatch(stack)
    steps = []
    capacity = 0.0
    for rate in rates:
        print(f"  {rate:g} orders/s for {step_seconds:g} s ...", flush=True)
        result = step(stack, watch, sku, rate, step_seconds, drain_seconds)
        steps.append(result)
        verdict = "kept up" if result["kept_up"] else "fell behind"
        print(
            f"    {verdict}: p50 {result['confirmed_p50_ms'] or 0:.0f} ms, "
            f"{result['cpu_ms_per_order_total']:.0f} CPU ms/order",
            flush=True,
        )
        if not result["kept_up"]:
            break
        capacity = rate
    return {
        "orders_per_s": capacity,
        "step_seconds": step_seconds,
        "drain_seconds": drain_seconds,
        "steps": steps,
    }


def generate(api_url: str, sku: str, rate: float, seconds: float) -> dict[str, Any]:
    """Open-loop POSTs at `rate` for `seconds`: a late request is not skipped, so a slow API shows as
    latency, not as a lower rate. Each order's time is when it was scheduled (or sent, if earlier)."""
    import requests

    session = requests.Session()
    adapter = requests.adapters.HTTPAdapter(pool_connections=1, pool_maxsize=32)
    session.mount("http://", adapter)
    sent: dict[str, float] = {}
    errors: list[str] = []
    lock = threading.Lock()
    body: dict[str, Any] = {
        "customerId": "c-bench",
        "currency": "USD",
        "items": [{"sku": sku, "quantity": 1, "unitPrice": 100}],
    }

    def post(scheduled: float) -> None:
        started = time.time()
        try:
            response = session.post(
                f"{api_url}/orders", json=body, headers={"Idempotency-Key": str(uuid.uuid4())}, timeout=30
            )
        except requests.RequestException as exc:
            with lock:
                errors.append(type(exc).__name__)
            return
        with lock:
            if response.status_code == 201:
                sent[response.json()["orderId"]] = min(started, scheduled)
            else:
                errors.append(str(response.status_code))

    offered = offer_at_rate(post, rate, seconds, workers=32)
    return {"sent": sent, "errors": errors, "achieved_rate_per_s": len(sent) / max(offered, 1e-9)}


def one_at_a_time(stack: LocalStack, sku: str, orders: int) -> dict[str, Any]:
    """POST -> CONFIRMED of one order at a time on a warm stack (after one warm-up order)."""
    import requests

    watch = ConfirmationWatch(stack)
    session = requests.Session()
    body: dict[str, Any] = {
        "customerId": "c-bench",
        "currency": "USD",
        "items": [{"sku": sku, "quantity": 1, "unitPrice": 100}],
    }
    times = []
    for index in range(orders + 1):
        started = time.time()
        response = session.post(
            f"{stack.api_url}/orders", json=body, headers={"Idempotency-Key": str(uuid.uuid4())}, timeout=30
        )
        response.raise_for_status()
        order_id = response.json()["orderId"]
        if not watch.wait_for([order_id], time.time() + 10):
            raise TimeoutError(f"order {order_id} not confirmed within 10 s")
        if index:  # the first one warms up
            times.append(watch.confirmed_at[order_id] - started)
    return {
        "orders": orders,
        "median_ms": 1000 * statistics.median(times),
        "p90_ms": 1000 * percentile(times, 0.9),
        "load_average": os.getloadavg()[0],
    }


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "generate":
        print(json.dumps(generate(sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5]))))
    else:
        sys.exit("usage: python -m tools.bench.capacity generate API_URL SKU RATE SECONDS")
