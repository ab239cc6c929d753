"""Write a template with its Fn::ForEach loops expanded, for scanners that do not expand them (checkov).

    python -m tools.template.expand [TEMPLATE] [OUTPUT]
    (default: template.yaml → .aws-sam/expanded/template.json)

The expansion is SAM CLI's (tools.template.load_yaml): every resource a loop generates is written out
under its own logical ID, so a scan of the output covers each of them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tools.template.reader import ROOT, TEMPLATE_PATH, load_yaml

DEFAULT_OUTPUT = ROOT / ".aws-sam" / "expanded" / "template.json"


def main(argv: list[str]) -> int:
    source = Path(argv[0]) if argv else TEMPLATE_PATH
    output = Path(argv[1]) if len(argv) > 1 else DEFAULT_OUTPUT
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(load_yaml(source), indent=1) + "\n")
    print(f"{source} expanded to {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
