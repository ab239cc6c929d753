"""`python -m tools.template.change_set Name=Value ... -- Name=Value ...`: what CloudFormation does to
each resource when a stack deployed with the first parameters is updated to the second
(tools/template/comparison.py; parameters not given keep their defaults): one line per resource acted on."""

from __future__ import annotations

import sys

from tools.template.comparison import changes


def main(argv: list[str]) -> int:
    split = argv.index("--") if "--" in argv else len(argv)
    before = dict(a.split("=", 1) for a in argv[:split])
    after = dict(a.split("=", 1) for a in argv[split + 1 :])
    print(changes(before, after).table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
