"""The fault injector's machinery, whatever the role of the function it runs in (tools/chaos/faults.py).

ChaosCrash (the process dies: nothing catches it); FunctionState, the counters and faulted ids a
function's incarnations share (a JSON file under flock); Arms, the crashes one process arms for
another's next opportunity; BatchTracker, which message of its SQS batch a consumer handles;
InjectorBase, the decisions (a seeded draw per opportunity, the caps, the ledger line); and
after_import, which wraps a module once the function first imports it.
"""

from __future__ import annotations

import fcntl
import functools
import importlib.abc
import importlib.machinery
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from botocore.client import BaseClient
from botocore.exceptions import ClientError

from tools.chaos.ledger import Ledger
from tools.chaos.plan import CONSUMER, NOTIFIER, FunctionPlan, Plan, seeded_rng

ApiCall = Callable[[BaseClient, str, dict[str, Any]], Any]


class ChaosCrash(BaseException):
    """The process dies here (a crash, an out-of-memory kill): not an Exception, so nothing catches it."""


def client_error(code: str, message: str, operation: str, status: int = 400, **extra: Any) -> ClientError:
    response: dict[str, Any] = {
        "Error": {"Code": code, "Message": f"chaos: {message}"},
        "ResponseMetadata": {"HTTPStatusCode": status},
        **extra,
    }
    return ClientError(response, operation)  # type: ignore[arg-type]


@contextmanager
def _locked_json(path: Path, lock_path: Path, default: Callable[[], Any]) -> Iterator[Any]:
    """A JSON document shared by processes: read under an exclusive flock, written back on leaving."""
    with lock_path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            document = json.loads(path.read_text()) if path.exists() else default()
            yield document
            temporary = path.with_suffix(".tmp")
            temporary.write_text(json.dumps(document))
            temporary.replace(path)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class FunctionState:
    """Counters and faulted ids of one function, shared by all its incarnations (a JSON file under flock)."""

    def __init__(self, directory: Path, function: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._path = directory / f"{function}.json"
        self._lock_path = directory / f"{function}.lock"

    @contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        with _locked_json(
            self._path, self._lock_path, lambda: {"incarnations": 0, "counts": {}, "faulted": []}
        ) as state:
            yield state

    def new_incarnation(self) -> int:
        with self._locked() as state:
            state["incarnations"] += 1
            return int(state["incarnations"])

    def counts(self) -> dict[str, int]:
        with self._locked() as state:
            return dict(state["counts"])

    def tally(self, kind: str, cap: int) -> bool:
        """Count one fault of `kind` that marks no id (it may strike the same message again)."""
        with self._locked() as state:
            counts: dict[str, int] = state["counts"]
            if counts.get(kind, 0) >= cap:
                return False
            counts[kind] = counts.get(kind, 0) + 1
            return True

    def claim(self, kind: str, ids: list[str], cap: int) -> bool:
        """Reserve one fault of `kind` on `ids`: refused past the cap or if any id was faulted before."""
        with self._locked() as state:
            counts: dict[str, int] = state["counts"]
            faulted = set(state["faulted"])
            if counts.get(kind, 0) >= cap or faulted.intersection(ids):
                return False
            counts[kind] = counts.get(kind, 0) + 1
            state["faulted"].extend(ids)
            return True

    def release(self, kind: str, ids: list[str]) -> None:
        """Give back a fault claimed but never injected (the call it was to follow failed on its own)."""
        with self._locked() as state:
            state["counts"][kind] = max(0, state["counts"].get(kind, 0) - 1)
            state["faulted"] = [faulted for faulted in state["faulted"] if faulted not in set(ids)]


class Arms:
    """Crashes armed for one function by another process (the migration function, at a relay switch's
    steps), taken in the order they were armed by the function's next opportunity (its next PutEvents),
    each once. Every arm stays in the file, taken or withdrawn: the harness reports them all."""

    def __init__(self, directory: Path, function: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._path = directory / f"{function}.arms.json"
        self._lock_path = directory / f"{function}.arms.lock"

    def _locked(self) -> Any:
        return _locked_json(self._path, self._lock_path, list)

    def arm(self, **details: Any) -> int:
        with self._locked() as arms:
            number = len(arms) + 1
            arms.append(
                {"arm": number, "armed_at": time.time(), "taken_at": None, "withdrawn": False, **details}
            )
            return number

    def take(self, **taker: Any) -> dict[str, Any] | None:
        """The first arm neither taken nor withdrawn, now taken (by `taker`); None when there is none."""
        with self._locked() as arms:
            for arm in arms:
                if arm["taken_at"] is None and not arm["withdrawn"]:
                    arm.update(taken_at=time.time(), taker=taker)
                    return dict(arm)
            return None

    def give_back(self, number: int) -> None:
        """A taken arm whose crash never happened (the call it was to follow failed on its own)."""
        with self._locked() as arms:
            for arm in arms:
                if arm["arm"] == number:
                    arm.update(taken_at=None, taker=None)

    def withdraw(self, number: int) -> bool:
        """No longer to be taken; False when it was taken already."""
        with self._locked() as arms:
            for arm in arms:
                if arm["arm"] == number and arm["taken_at"] is None:
                    arm["withdrawn"] = True
                    return True
            return False

    def taken(self, number: int) -> bool:
        with self._locked() as arms:
            return any(arm["arm"] == number and arm["taken_at"] is not None for arm in arms)

    def all(self) -> list[dict[str, Any]]:
        with self._locked() as arms:
            return [dict(arm) for arm in arms]


def _detail_id(body: Any) -> str | None:
    """The CloudEvent id of an SQS body holding an EventBridge event, None when malformed."""
    try:
        document = json.loads(body)
    except (TypeError, ValueError):
        return None
    detail = document.get("detail") if isinstance(document, dict) else None
    event_id = detail.get("id") if isinstance(detail, dict) else None
    return event_id if isinstance(event_id, str) else None


class BatchTracker:
    """Which SQS batch, and which message of it, the consumer is handling (Powertools' batch processor)."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.current: Any = None

    def install(self) -> None:
        from aws_lambda_powertools.utilities.batch.base import BasePartialProcessor

        tracker = self
        original = BasePartialProcessor.__call__

        def tracked_call(
            processor: BasePartialProcessor, records: list[dict[str, Any]], handler: Any, *args: Any
        ) -> Any:
            tracker.records = list(records)

            @functools.wraps(handler)
            def tracked_handler(*h_args: Any, **h_kwargs: Any) -> Any:
                tracker.current = h_kwargs.get("record", h_args[0] if h_args else None)
                try:
                    return handler(*h_args, **h_kwargs)
                finally:
                    tracker.current = None

            return original(processor, records, tracked_handler, *args)

        setattr(BasePartialProcessor, "__call__", tracked_call)  # noqa: B010 - patching a dunder

    def current_ids(self) -> tuple[str | None, str | None]:
        """(event id, message id) of the message being handled."""
        record = self.current
        if record is None:
            return None, None
        body = getattr(record, "body", None)
        return _detail_id(body), getattr(record, "message_id", None)

    def receive_counts(self) -> list[int]:
        """ApproximateReceiveCount of each well-formed message of the batch (malformed ones die anyway)."""
        counts = []
        for record in self.records:
            if _detail_id(record.get("body")) is None:
                continue
            counts.append(int((record.get("attributes") or {}).get("ApproximateReceiveCount", "1")))
        return counts


class InjectorBase:
    """One function's injector: its plan, state and ledger, and the decisions every hook makes."""

    def __init__(self, plan: Plan, function: str, spec: FunctionPlan) -> None:
        self.plan = plan
        self.function = function
        self.spec = spec
        self.ledger = Ledger(plan.ledger)
        self.state = FunctionState(Path(plan.state_dir), function)
        self.incarnation = self.state.new_incarnation()
        self.rng = seeded_rng(plan.seed, function, self.incarnation)
        self.batch = BatchTracker() if spec.role in {CONSUMER, NOTIFIER} else None
        self._satisfied: set[str] = set()  # kinds with `ensure` known to have happened
        self._persistent: dict[str, int] = {}  # event id -> failures still to inject in this process
        self._slot_read: list[Any] = []  # the logical relay's last peek: its decoded transactions
        # The round's activation of replay sets, committed unless a crash came first: the end of the log
        # position of the first transaction carrying one of their messages, their ids and kinds.
        self._activated: tuple[int, list[int], list[str]] | None = None
        self.arms = Arms(Path(plan.state_dir), function)

    # --- decisions ------------------------------------------------------------------------------
    def _pick(self, candidates: tuple[str, ...]) -> str | None:
        kinds = [kind for kind in candidates if kind in self.spec.faults]
        if not kinds:
            return None
        draw = self.rng.random()
        pending = [k for k in kinds if self.spec.faults[k].ensure and k not in self._satisfied]
        if pending:
            counts = self.state.counts()
            self._satisfied.update(k for k in pending if counts.get(k, 0) > 0)
            pending = [k for k in pending if k not in self._satisfied]
        if pending:
            return pending[0]
        threshold = 0.0
        for kind in kinds:
            threshold += self.spec.faults[kind].probability
            if draw < threshold:
                return kind
        return None

    def _claim(self, kind: str, ids: list[str]) -> bool:
        if not self.state.claim(kind, ids, self.spec.faults[kind].cap):
            return False
        self._satisfied.add(kind)
        return True

    def _record(self, kind: str, operation: str, **details: Any) -> None:
        self.ledger.append(kind, self.function, operation, incarnation=self.incarnation, **details)


class _ThenLoader(importlib.abc.Loader):
    """A module's own loader, then `then(module)` once the module has run (its names exist)."""

    def __init__(self, loader: importlib.abc.Loader, then: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._then = then

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._then(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ...: the real loader's
        return getattr(self._loader, name)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `then` on module `name` when it is first imported (the function imports it from its own
    layer, after this preload narrowed nothing: the wrapped module is the one the handler uses)."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self._name = name
        self._then = then

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self._name:
            return None
        sys.meta_path.remove(self)  # once
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec: importlib.machinery.ModuleSpec | None = (
                find(fullname, path, target) if find is not None else None
            )
            if spec is not None and spec.loader is not None:
                spec.loader = _ThenLoader(spec.loader, self._then)
                return spec
        return None


def after_import(name: str, then: Callable[[ModuleType], None]) -> None:
    """`then(module)` now if `name` is imported already, else right after its first import."""
    module = sys.modules.get(name)
    if module is not None:
        then(module)
    else:
        sys.meta_path.insert(0, _AfterImport(name, then))


# The PostgreSQL publisher's PutEvents transport over awscrt (PUBLISH_TRANSPORT=crt), which does not go
# through botocore's BaseClient._make_api_call.
CRT_TRANSPORT_MODULE = "shop.adapters.eventbridge_crt"


def wrap_crt_put_events(hook: Callable[[ApiCall, Any, str, dict[str, Any]], Any]) -> None:
    """Send the awscrt transport's PutEvents through `hook(original, transport, "PutEvents", params)`, as
    botocore's calls go through the BaseClient._make_api_call seam: a fault or a refusal is injected
    whichever transport the function publishes with.

    Both of the transport's ways in are wrapped: `put_events` (one call, waited for) and `begin` (the
    publisher's: a call answered later). The hook is synchronous, so a begun call runs it on a thread of
    its own, as many at once as the publisher begins, and its outcome, whatever the hook returned or
    raised (a ChaosCrash too: the publisher raises it on its own thread, and the worker dies), is the
    call's answer. So under chaos the transport's own callbacks do not answer the publisher (each begun
    call is sent through the waited-for put_events): tests/conformance/test_put_events_transport.py holds
    that path, timeouts included."""

    def wrap(module: ModuleType) -> None:
        send = module.CrtPutEvents.put_events

        def original(transport: Any, operation: str, params: dict[str, Any]) -> Any:
            return send(transport, Entries=params["Entries"])

        @functools.wraps(send)
        def put_events(transport: Any, *, Entries: list[dict[str, Any]]) -> Any:
            return hook(original, transport, "PutEvents", {"Entries": Entries})

        @functools.wraps(module.CrtPutEvents.begin)
        def begin(transport: Any, entries: list[dict[str, Any]], answer: Callable[[Any], None]) -> None:
            def call() -> None:
                try:
                    outcome = hook(original, transport, "PutEvents", {"Entries": entries})
                except BaseException as exc:  # noqa: BLE001 -- the call's answer, raised by the publisher
                    outcome = exc
                answer(outcome)

            threading.Thread(target=call, name="chaos-put-events", daemon=True).start()

        module.CrtPutEvents.put_events = put_events
        module.CrtPutEvents.begin = begin

    after_import(CRT_TRANSPORT_MODULE, wrap)
