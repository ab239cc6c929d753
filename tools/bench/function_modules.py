"""A function's handler module as the bench runs it: functions/<name>/app.py, loaded afresh each time (not
registered in sys.modules), so each part gets its own cached clients and publisher."""

from __future__ import annotations

import importlib.util
from typing import Any

from tools.template import ROOT


def load_function(name: str, part: str) -> Any:
    """functions/<name>/app.py as a new module named after the bench part that loads it."""
    spec = importlib.util.spec_from_file_location(
        f"bench_{part}_{name}", ROOT / "functions" / name / "app.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
