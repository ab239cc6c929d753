"""`python -m tools.docs` (make docs): regenerate docs/reference.md's tables, docs/events.md's table and
docs/asyncapi.yaml. `python -m tools.docs --check`: write nothing; exit 1 naming each stale file.
Exit status 2: the template or the code says something the docs cannot express (the message says what).
"""

from __future__ import annotations

import argparse
import sys

from tools.docs import pages
from tools.docs.cfn import TemplateError
from tools.docs.domain import ROOT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.docs", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if a generated file is stale")
    args = parser.parse_args(argv)
    try:
        if args.check:
            stale = pages.stale()
            for path in stale:
                print(f"stale: {path.relative_to(ROOT)} (run `make docs`)", file=sys.stderr)
            return 1 if stale else 0
        for path in pages.write():
            print(f"wrote {path.relative_to(ROOT)}")
    except (TemplateError, pages.MarkerError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
