"""The faults of a relay switch (role `migration`: the order database's migration function, on
shop.adapters.postgres.relay_mode's switch_relay, _prepare_slot, _to_logical and _drop_slot): at each
step of the switch the harness asked for (SWITCH_FILE, write_switch), a crash of the publisher armed,
and the poison row pending at the handover. The steps themselves run unchanged."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from tools.chaos.injection import Arms, InjectorBase
from tools.chaos.plan import POISON_OUTBOX_ITEM

# The migration function's relay switch (switch_relay calls its steps through the module's globals).
RELAY_MODE_MODULE = "shop.adapters.postgres.relay_mode"
# In the plan's state_dir: the switch the harness is about to ask the migration function for (its label,
# the relay it switches to, the function whose crashes to arm and how); absent, the hooks do nothing (the
# stack's own Create at start-up).
SWITCH_FILE = "switch.json"
_ARM_POLL_SECONDS = 0.05
# A poison row of the outbox, as the harness writes it (tools/chaos/postgres_store.poison_row's values).
INSERT_POISON_ROW = (
    "INSERT INTO outbox (event_id, aggregate_id, sequence, event_type, envelope)"
    " VALUES (%(event_id)s, %(aggregate_id)s, %(sequence)s, 'OrderCreated', %(envelope)s)"
)
# A switch's steps, where the migration function arms a publisher's crash: by the relay switched to, the
# first and the last (around the whole switch), and the one between its two parts.
POINTS = {
    "logical": ("before the slot's creation", "after the handover"),
    "polling": ("before the handover", "after the slot is dropped"),
}
BEFORE_HANDOVER_TO_LOGICAL = "after the slot's creation, before the handover"
BEFORE_SLOT_DROP = "after the handover, before the slot is dropped"
SWITCH_POINTS = {
    "logical": (POINTS["logical"][0], BEFORE_HANDOVER_TO_LOGICAL, POINTS["logical"][1]),
    "polling": (POINTS["polling"][0], BEFORE_SLOT_DROP, POINTS["polling"][1]),
}


def write_switch(state_dir: Path, **switch: Any) -> None:
    """What the migration function's next relay switch arms (see SWITCH_FILE); `clear_switch` after it."""
    path = state_dir / SWITCH_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(switch))
    temporary.replace(path)


def clear_switch(state_dir: Path) -> None:
    (state_dir / SWITCH_FILE).unlink(missing_ok=True)


class MigrationFaults(InjectorBase):
    def wrap_switch(self, module: ModuleType) -> None:
        """Wrap the relay switch (shop.adapters.postgres.relay_mode): at each of its steps, arm a crash of
        the publisher (see _switch_point); the steps themselves run unchanged."""
        real_switch: Callable[..., str] = module.switch_relay
        real_prepare: Callable[..., None] = module._prepare_slot
        real_drop: Callable[..., bool] = module._drop_slot
        real_to_logical: Callable[..., str] = module._to_logical
        injector = self

        @functools.wraps(real_switch)
        def switch_relay(connection: Any, mode: str, slot: str, **options: Any) -> str:
            # To logical the slot is created first (creating it waits for the rounds in progress); to
            # polling the handover is first (it waits for the round holding the slot's lock).
            first, last = POINTS.get(mode, ("before the switch", "after the switch"))
            injector._switch_point(mode, first, hold=True)
            if mode == "polling":  # committed while the armed round holds the slot: the slot holds it
                injector._poison_at_handover(connection, mode)
            outcome = real_switch(connection, mode, slot, **options)
            injector._switch_point(mode, last, hold=False)
            return outcome

        @functools.wraps(real_to_logical)
        def _to_logical(cursor: Any, slot: str) -> str:
            # As if committed just before the outbox's lock: pending at the handover.
            injector._poison_at_handover(cursor, "logical")
            return real_to_logical(cursor, slot)

        @functools.wraps(real_prepare)
        def _prepare_slot(connection: Any, slot: str, bounds: Any) -> None:
            real_prepare(connection, slot, bounds)
            # The handover locks the outbox: it waits for the polling round holding its rows.
            injector._switch_point("logical", BEFORE_HANDOVER_TO_LOGICAL, hold=True)

        @functools.wraps(real_drop)
        def _drop_slot(connection: Any, slot: str, bounds: Any) -> bool:
            injector._switch_point("polling", BEFORE_SLOT_DROP, hold=False)
            return real_drop(connection, slot, bounds)

        setattr(module, "switch_relay", switch_relay)  # noqa: B010 - the seam, on purpose
        setattr(module, "_prepare_slot", _prepare_slot)  # noqa: B010 - the seam, on purpose
        setattr(module, "_drop_slot", _drop_slot)  # noqa: B010 - the seam, on purpose
        setattr(module, "_to_logical", _to_logical)  # noqa: B010 - the seam, on purpose

    def _switch(self, mode: str) -> dict[str, Any] | None:
        """The switch to `mode` the harness asked for (SWITCH_FILE), None when none."""
        try:
            switch: dict[str, Any] = json.loads((Path(self.plan.state_dir) / SWITCH_FILE).read_text())
        except (OSError, ValueError):
            return None
        return switch if switch.get("to") == mode else None

    def _poison_at_handover(self, executor: Any, mode: str) -> None:
        """The poison row the harness asked for (the switch's "poison_row"), written now: pending when the
        switch hands the outbox over (to logical: in the handover's transaction, as if committed just
        before its lock; to polling: committed while the armed round holds the slot, so the slot still
        holds it at the handover)."""
        switch = self._switch(mode)
        row = switch.get("poison_row") if switch is not None else None
        if switch is None or not row:
            return
        executor.execute(INSERT_POISON_ROW, row["values"])
        self.ledger.append(POISON_OUTBOX_ITEM, str(switch["function"]), "INSERT", **row["details"])

    def _switch_point(self, mode: str, point: str, *, hold: bool) -> None:
        """A step of the switch the harness asked for (SWITCH_FILE) to `mode`: arm the publisher's next
        PutEvents to be its last. Before a step that waits for the rounds in progress (`hold`), the
        armed round holds its locks a while and the switch goes on once a publisher took the arm, so the
        step waits on the round that dies; an arm nobody took in time is withdrawn (the report says so)."""
        switch = self._switch(mode)
        if switch is None:
            return
        arms = Arms(Path(self.plan.state_dir), str(switch["function"]))
        number = arms.arm(
            switch=switch.get("switch"),
            to=mode,
            point=point,
            hold_seconds=float(switch.get("hold_seconds", 0.0)) if hold else 0.0,
            waited=hold,
        )
        if not hold:
            return
        deadline = time.monotonic() + float(switch.get("arm_wait_seconds", 0.0))
        while time.monotonic() < deadline:
            if arms.taken(number):
                return
            time.sleep(_ARM_POLL_SECONDS)
        arms.withdraw(number)
