"""The client side: orders, cancels and retries over HTTP, as a careful client would send them.

Every create carries an Idempotency-Key and is retried with the same key (and body) after a timeout,
409 REQUEST_IN_PROGRESS, 503 SERVICE_BUSY (after Retry-After, which a 503 must carry) or an unexpected
5xx, within a bounded number of attempts, or of seconds (an outage of the order database lasts longer
than eight one-second pauses). Some creates are sent twice at once on purpose; some orders are cancelled right
after their create, some a little later; some lines ask for scarce SKUs so some orders are rejected.
Everything the client saw is kept for the checks.
"""

from __future__ import annotations

import heapq
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import requests

from tools.chaos.plan import seeded_rng

MAX_ATTEMPTS = 8
# Past MAX_ATTEMPTS a request is still retried until this many seconds after its first attempt (at most
# MAX_ATTEMPTS_IN_BUDGET attempts).
RETRY_BUDGET_SECONDS = 30.0
MAX_ATTEMPTS_IN_BUDGET = 40
_RETRY_CODES = frozenset({"REQUEST_IN_PROGRESS", "CONCURRENT_MODIFICATION", "SERVICE_BUSY"})
_MAX_RETRY_AFTER_SECONDS = 2.0


@dataclass(frozen=True)
class Stock:
    plenty: tuple[str, ...]
    scarce: tuple[str, ...]
    initial: dict[str, int]


HOT_SKU = "SKU-CHAOS-HOT"


def stock_for(orders: int, *, hot_sku: bool = False) -> Stock:
    if hot_sku:  # every order on one SKU: every reservation writes the same stock item
        return Stock((HOT_SKU,), (), {HOT_SKU: 1_000_000})
    plenty = tuple(f"SKU-CHAOS-{i}" for i in range(6))
    scarce = tuple(f"SKU-CHAOS-SCARCE-{i}" for i in range(3))
    # A quarter of the orders ask a scarce SKU for 1-2 units; it holds about a third of that demand.
    initial = {sku: 1_000_000 for sku in plenty} | {sku: max(1, orders // 40) for sku in scarce}
    return Stock(plenty, scarce, initial)


@dataclass(frozen=True)
class OrderScript:
    index: int
    key: str
    body: dict[str, Any]
    double_send: bool
    cancel: str | None  # "now", "later" or None
    cancel_delay: float


def scripts(orders: int, seed: int, stock: Stock) -> list[OrderScript]:
    rng = seeded_rng(seed, "driver")
    out = []
    for index in range(orders):
        skus = rng.sample(stock.plenty, min(len(stock.plenty), rng.randint(1, 2)))
        items = [{"sku": s, "quantity": rng.randint(1, 3), "unitPrice": rng.randint(1, 5000)} for s in skus]
        if rng.random() < 0.25 and stock.scarce:
            items.append({"sku": rng.choice(stock.scarce), "quantity": rng.randint(1, 2), "unitPrice": 999})
        roll = rng.random()
        cancel = "now" if roll < 0.08 else "later" if roll < 0.16 else None
        out.append(
            OrderScript(
                index=index,
                key=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                body={"customerId": f"c-chaos-{index % 50}", "currency": "USD", "items": items},
                double_send=rng.random() < 0.05,
                cancel=cancel,
                cancel_delay=rng.uniform(0.2, 3.0),
            )
        )
    return out


@dataclass
class Answer:
    status: int | None  # None: no answer (timeout, connection error)
    body: Any = None
    error_code: str | None = None
    replayed: bool = False
    problem: str | None = None  # a response that breaks the API contract
    at: float = field(default_factory=time.time)  # when it came (epoch seconds)


@dataclass
class OrderOutcome:
    script: OrderScript
    create_answers: list[Answer] = field(default_factory=list)
    cancel_answers: list[Answer] = field(default_factory=list)

    @property
    def order_ids(self) -> set[str]:
        return {str(a.body["orderId"]) for a in self.create_answers if a.status == 201}

    @property
    def created(self) -> bool:
        return any(a.status == 201 for a in self.create_answers)

    @property
    def cancel_final(self) -> Answer | None:
        return self.cancel_answers[-1] if self.cancel_answers else None


def _error_body_problem(status: int, body: Any) -> str | None:
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict) or set(error) != {"code", "message", "details"}:
        return f"{status} without the error body: {str(body)[:200]}"
    if not isinstance(error["code"], str) or not isinstance(error["message"], str):
        return f"{status} with a malformed error body: {str(body)[:200]}"
    if not isinstance(error["details"], dict):
        return f"{status} with non-object details: {str(body)[:200]}"
    return None


class Driver:
    def __init__(self, api_url: str, client_timeout: float, workers: int) -> None:
        self._url = api_url.rstrip("/")
        self._timeout = client_timeout
        self._workers = workers
        self._local = threading.local()
        self._lock = threading.Lock()
        self.counters: Counter[str] = Counter()
        self.outcomes: list[OrderOutcome] = []
        self._later: list[tuple[float, int, OrderOutcome]] = []
        self._submitted: list[Future[None]] = []

    def _session(self) -> requests.Session:
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            self._local.session = session
        return session

    def counts(self) -> Counter[str]:
        """The counters now (a copy: the clients' threads go on counting)."""
        with self._lock:
            return Counter(self.counters)

    def _count(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self.counters[name] += amount

    # --- one request, retried -------------------------------------------------------------------
    def _ask(self, method: str, path: str, body: Any = None, key: str | None = None) -> list[Answer]:
        answers: list[Answer] = []
        headers = {"Idempotency-Key": key} if key else {}
        began = time.monotonic()
        for attempt in range(MAX_ATTEMPTS_IN_BUDGET):
            if attempt >= MAX_ATTEMPTS and time.monotonic() - began >= RETRY_BUDGET_SECONDS:
                break
            if attempt:
                self._count("retries")
            self._count("requests")
            try:
                response = self._session().request(
                    method, f"{self._url}{path}", json=body, headers=headers, timeout=self._timeout
                )
            except requests.Timeout:
                self._count("client_timeouts")
                answers.append(Answer(None, problem=None))
                continue
            except requests.ConnectionError as exc:
                self._count("connection_errors")
                answers.append(Answer(None, body=repr(exc)))
                time.sleep(0.2)
                continue
            answer = self._read(response)
            answers.append(answer)
            if answer.problem:
                self._count("contract_breaks")  # the live line's count (api_contract lists them at the end)
            self._count(f"http_{response.status_code}")
            if response.status_code < 400:
                return answers
            if response.status_code >= 500 or answer.error_code in _RETRY_CODES:
                retry_after = response.headers.get("Retry-After")
                pause = float(retry_after) if retry_after and retry_after.isdigit() else 0.2 * (attempt + 1)
                time.sleep(min(pause, _MAX_RETRY_AFTER_SECONDS))
                continue
            return answers
        self._count("gave_up")
        return answers

    def _read(self, response: requests.Response) -> Answer:
        try:
            body = response.json()
        except ValueError:
            body = response.text[:500]
        answer = Answer(response.status_code, body)
        answer.replayed = response.headers.get("Idempotent-Replayed") == "true"
        if response.status_code >= 400:
            answer.problem = _error_body_problem(response.status_code, body)
            if answer.problem is None:
                answer.error_code = str(body["error"]["code"])
            if response.status_code >= 500 and response.status_code != 503:
                answer.problem = answer.problem or f"unexpected {response.status_code}: {answer.error_code}"
            if response.status_code == 503 and not response.headers.get("Retry-After"):
                answer.problem = answer.problem or "503 without Retry-After"
        elif response.status_code in {200, 201} and not (isinstance(body, dict) and "orderId" in body):
            answer.problem = f"{response.status_code} without an order: {str(body)[:200]}"
        return answer

    # --- scripts --------------------------------------------------------------------------------
    def _create(self, outcome: OrderOutcome) -> None:
        script = outcome.script
        if script.double_send:
            self._count("double_sends")
            with ThreadPoolExecutor(max_workers=1) as twin:
                second = twin.submit(self._ask, "POST", "/orders", script.body, script.key)
                first = self._ask("POST", "/orders", script.body, script.key)
                outcome.create_answers.extend(first + second.result())
        else:
            outcome.create_answers.extend(self._ask("POST", "/orders", script.body, script.key))
        if not outcome.created:
            return
        if script.cancel == "now":
            self._cancel(outcome)
        elif script.cancel == "later":
            with self._lock:
                due = time.monotonic() + script.cancel_delay
                heapq.heappush(self._later, (due, script.index, outcome))

    def _cancel(self, outcome: OrderOutcome) -> None:
        self._count("cancels")
        order_id = sorted(outcome.order_ids)[0]
        outcome.cancel_answers.extend(self._ask("POST", f"/orders/{order_id}/cancel"))

    def run(
        self, plan: list[OrderScript], on_progress: Any = None, rate: float | None = None
    ) -> list[OrderOutcome]:
        """Send every script (at most `rate` creates a second); returns when every request has its answer."""
        self.outcomes = [OrderOutcome(s) for s in plan]
        began = time.monotonic()
        with ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix="client") as pool:
            active: list[Future[None]] = []
            for index, outcome in enumerate(self.outcomes):
                due = began + index / rate if rate else 0.0
                # Keep the queue short so cancels scheduled "later" are not stuck behind every create.
                while len(active) >= 2 * self._workers or time.monotonic() < due:
                    self._submit_due_cancels(pool, active)
                    active = [f for f in active if not f.done()]
                    time.sleep(0.01)
                active.append(pool.submit(self._create, outcome))
                self._submitted.append(active[-1])
                if on_progress is not None:
                    on_progress(index, outcome)
            while True:
                self._submit_due_cancels(pool, active)
                active = [f for f in active if not f.done()]  # first: a finished create schedules no cancel
                with self._lock:
                    waiting = bool(self._later)
                if not active and not waiting:
                    break
                time.sleep(0.05)
        for future in self._submitted:
            future.result()  # a bug in the client side surfaces here
        return self.outcomes

    def _submit_due_cancels(self, pool: ThreadPoolExecutor, futures: list[Future[None]]) -> None:
        now = time.monotonic()
        while True:
            with self._lock:
                if not self._later or self._later[0][0] > now:
                    return
                _, _, outcome = heapq.heappop(self._later)
            futures.append(pool.submit(self._cancel, outcome))
            self._submitted.append(futures[-1])
