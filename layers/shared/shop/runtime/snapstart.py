"""Lambda SnapStart: what must differ between execution environments restored from one snapshot.

With SnapStart (template parameter SnapStart=PublishedVersions) Lambda runs the init phase once per
published version and resumes every new environment from that memory snapshot. Whatever init
computed is then shared by all of them (docs/performance.md, "SnapStart"):
- ids: none is made at import (tests/unit/test_snapstart.py checks the modules); event ids and
  order ids come from uuid4 (os.urandom, the kernel's entropy) when a request or event is handled;
- the `random` module's state: seeded once at import, so it would be the same in every restored
  environment; the publisher's retry jitter draws from it, and identical jitter in environments
  that fail together defeats its purpose. It is reseeded after each restore;
- AWS clients: built on first use (shop.adapters.aws), never at import, so none is in a snapshot.
"""

from __future__ import annotations

import random


def reseed_after_restore() -> None:
    """Fresh entropy for `random` in this environment (os.urandom is read anew)."""
    random.seed()


def register_restore_hooks() -> bool:
    """Register the after-restore hook with Lambda's runtime; False where there is no such runtime.

    snapshot_restore_py ships with Lambda's managed Python runtimes (3.12+), not with this project:
    on a developer machine, in tests and in the local stack it is absent and nothing is registered.
    """
    try:
        from snapshot_restore_py import register_after_restore  # type: ignore[import-not-found]
    except ImportError:
        return False
    register_after_restore(reseed_after_restore)
    return True
