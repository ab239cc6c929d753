"""`python -m tools.artefacts [BUILD_DIR]` (default .aws-sam/build): check what `sam build` made.

Prints each problem (`path: reason`, paths relative to BUILD_DIR) and exits 1; with none, prints a
one-line summary and exits 0. Exit status 2: no build there (run `make build`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tools.artefacts.check import LAMBDA_UNZIPPED_LIMIT, check_build
from tools.template import ROOT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.artefacts", description=__doc__)
    parser.add_argument("build_dir", nargs="?", type=Path, default=ROOT / ".aws-sam" / "build")
    parser.add_argument(
        "--limit",
        type=int,
        default=LAMBDA_UNZIPPED_LIMIT,
        help="unzipped bytes allowed for a function with its layers (default: Lambda's 250 MB)",
    )
    args = parser.parse_args(argv)
    if not (args.build_dir / "template.yaml").is_file():
        print(f"error: no build in {args.build_dir} (run `make build`)", file=sys.stderr)
        return 2
    report = check_build(args.build_dir, limit=args.limit)
    for problem in report.problems:
        print(problem)
    if report.problems:
        print(f"{len(report.problems)} problems in {args.build_dir}", file=sys.stderr)
        return 1
    print(f"ok: {report.summary()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
