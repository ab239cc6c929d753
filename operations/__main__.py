"""`python -m operations redrive | redrive-poison | redrive-dlq | discard-poison | replay | recover-slot |
seed ...` (see operations/admin.py)."""

from __future__ import annotations

import sys
from pathlib import Path

# From a checkout the domain package is the shared layer's source; the functions get it as their layer.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "layers" / "shared"))

from operations.admin import main

raise SystemExit(main())
