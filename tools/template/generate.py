"""template.yaml from template.source.yaml: the source's Fn::ForEach loops written out, everything else as is.

    python -m tools.template.generate            (make template: writes template.yaml)
    python -m tools.template.generate --check    (exit 1 when template.yaml is not the source's output)

Why a generated template: SAM CLI's local commands (`sam local invoke`, `start-api`, `start-lambda`, 1.170)
crash on any `Fn::ForEach` in `Resources` (aws/aws-sam-cli#5647, #6903; ../shared/AWS-FACTS.md), while
`sam build`, `sam validate` and `sam deploy` accept the loops. So each repeated block is written once, in
the source, and the committed template.yaml, which every SAM command and every tool reads, has no loop.
Moving the repeated blocks into nested applications instead would give the tables, queues, log groups and
alarms of a deployed stack other logical ids in other stacks: CloudFormation would replace them (a
retained table orphaned beside a new empty one, a queue deleted with its messages, a named log group or
alarm created twice). Written out, every logical id and property stays what CloudFormation's own
expansion of the source gives (tests/unit/test_generated_template.py compares the two).

The expansion is textual, so the source's comments and layout reach template.yaml: a loop's fragment is
repeated once per value, dedented to the loop's own level, with
- `${Identifier}` replaced by the value (in keys, strings and DependsOn, as CloudFormation's transform does);
- `!Ref Identifier` replaced by the value (only the Components lookups use it: `!FindInMap [Components,
  !Ref Consumer, Service]` becomes `!FindInMap [Components, Inventory, Service]`);
- what the loop needed a function for, once the identifier is a literal, in its plain form:
  `!GetAtt [!Sub "InventoryQueue", Arn]` is `!GetAtt InventoryQueue.Arn` and
  `!Ref {"Fn::Sub": "InventoryQueue"}` is `!Ref InventoryQueue`.
Every other text is copied unchanged. A loop is written in the source as the template's own loops are:
`Fn::ForEach::<Name>:` at the section's indentation, then `- Identifier`, `- [A, B, ...]` and the fragment
`- <Key>:` ... (tests check that a loop written otherwise is refused, never half expanded).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from tools.template.reader import ROOT, TEMPLATE_PATH

SOURCE_PATH = ROOT / "template.source.yaml"
HEADER = (
    "# GENERATED from template.source.yaml by `make template` (python -m tools.template.generate):\n"
    "# edit that file, not this one. Its Fn::ForEach loops are written out here because SAM CLI's local\n"
    "# commands cannot read Fn::ForEach (tools/template/generate.py says why); `make test` fails while\n"
    "# the two disagree.\n"
)

_LOOP = re.compile(r"^(?P<indent> *)Fn::ForEach::(?P<name>[A-Za-z0-9]+):\s*$")
_IDENTIFIER = re.compile(r"^(?P<indent> *)- (?P<identifier>[A-Za-z0-9]+)\s*$")
_COLLECTION = re.compile(r"^(?P<indent> *)- \[(?P<values>[A-Za-z0-9, ]+)\]\s*$")
_FRAGMENT_START = re.compile(r"^(?P<indent> *)- (?P<rest>\S.*)$")


class GenerationError(ValueError):
    pass


@dataclass(frozen=True)
class Loop:
    name: str
    identifier: str
    values: tuple[str, ...]
    indent: int  # of the Fn::ForEach key, so of every key the loop writes
    fragment: tuple[str, ...]  # the fragment's lines, dedented to `indent`


def _substituted(line: str, identifier: str, value: str) -> str:
    line = line.replace("${" + identifier + "}", value)
    line = re.sub(rf"!Ref {identifier}\b", value, line)
    line = re.sub(r'!GetAtt \[!Sub "([A-Za-z0-9]+)", ([A-Za-z0-9.]+)\]', r"!GetAtt \1.\2", line)
    return re.sub(r'!Ref \{"Fn::Sub": "([A-Za-z0-9]+)"\}', r"!Ref \1", line)


def _read_loop(lines: list[str], at: int) -> tuple[Loop, int]:
    """The loop whose `Fn::ForEach::` key is lines[at], and the index of the first line after it."""
    head = _LOOP.match(lines[at])
    assert head is not None
    indent = len(head["indent"])
    where = f"line {at + 1} (Fn::ForEach::{head['name']})"
    identifier = _IDENTIFIER.match(lines[at + 1]) if at + 1 < len(lines) else None
    collection = _COLLECTION.match(lines[at + 2]) if at + 2 < len(lines) else None
    start = _FRAGMENT_START.match(lines[at + 3]) if at + 3 < len(lines) else None
    for found, what in ((identifier, "- Identifier"), (collection, "- [A, B, ...]"), (start, "- <Key>:")):
        if found is None or len(found["indent"]) != indent + 2:
            raise GenerationError(f"{where}: expected `{what}` indented by {indent + 2}")
    assert identifier is not None
    assert collection is not None
    assert start is not None
    body_indent = indent + 4
    fragment = [" " * indent + start["rest"]]
    end = at + 4
    while end < len(lines):
        line = lines[end]
        if line.strip() and len(line) - len(line.lstrip(" ")) < body_indent:
            break
        fragment.append(line[4:] if line.strip() else "")
        end += 1
    while fragment and not fragment[-1]:  # blank lines after the fragment separate, they do not repeat
        fragment.pop()
        end -= 1
    values = tuple(value.strip() for value in collection["values"].split(","))
    loop = Loop(head["name"], identifier["identifier"], values, indent, tuple(fragment))
    return loop, end


def _expanded(loop: Loop) -> list[str]:
    out: list[str] = []
    for n, value in enumerate(loop.values):
        if n:
            out.append("")
        out.append(f"{' ' * loop.indent}# Fn::ForEach::{loop.name}, {loop.identifier} = {value}")
        out.extend(_substituted(line, loop.identifier, value) for line in loop.fragment)
    return out


def generate(source: str) -> str:
    """The template for a source text: its loops written out (see the module docstring)."""
    lines = source.splitlines()
    out: list[str] = []
    at = 0
    while at < len(lines):
        if _LOOP.match(lines[at]):
            loop, at = _read_loop(lines, at)
            out.extend(_expanded(loop))
        else:
            if "Fn::ForEach" in lines[at] and not lines[at].lstrip().startswith("#"):
                raise GenerationError(
                    f"line {at + 1}: an Fn::ForEach this generator cannot read: {lines[at]!r}"
                )
            out.append(lines[at])
            at += 1
    return HEADER + "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    try:
        text = generate(SOURCE_PATH.read_text())
    except GenerationError as exc:
        print(f"template.source.yaml: {exc}", file=sys.stderr)
        return 2
    relative = TEMPLATE_PATH.relative_to(ROOT)
    if check:
        if TEMPLATE_PATH.read_text() != text:
            print(
                f"{relative} is not what template.source.yaml generates: run `make template`", file=sys.stderr
            )
            return 1
        print(f"{relative} is template.source.yaml's output")
        return 0
    Path(TEMPLATE_PATH).write_text(text)
    print(f"template.source.yaml written out to {relative}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
