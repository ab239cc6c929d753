"""template.yaml is template.source.yaml with its loops written out, and means exactly what the source means.

SAM CLI's local commands cannot read Fn::ForEach (tools/template/generate.py): the committed template has
none, and every logical id and property in it is what SAM CLI's own AWS::LanguageExtensions processors
make of the source's loops (the reader's load_yaml), so a deployed stack sees no change from the switch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tools.template import ROOT, TEMPLATE_PATH, load_yaml, parse_yaml
from tools.template.generate import SOURCE_PATH, GenerationError, generate


def keys(node: Any) -> set[str]:
    if isinstance(node, dict):
        return {str(k) for k in node} | {k for v in node.values() for k in keys(v)}
    if isinstance(node, list):
        return {k for item in node for k in keys(item)}
    return set()


def test_the_committed_template_is_what_the_source_generates():
    assert TEMPLATE_PATH.read_text() == generate(SOURCE_PATH.read_text()), (
        "run `make template` and commit both"
    )


def test_the_committed_template_has_no_loop_and_the_source_has_its_loops():
    assert not [k for k in keys(parse_yaml(TEMPLATE_PATH.read_text())) if k.startswith("Fn::ForEach")]
    loops = {k for k in parse_yaml(SOURCE_PATH.read_text())["Resources"] if k.startswith("Fn::ForEach::")}
    assert {"Fn::ForEach::Functions", "Fn::ForEach::Consumers", "Fn::ForEach::OutboxTables"} <= loops


def test_the_template_means_what_sam_clis_expansion_of_the_source_means():
    assert load_yaml(TEMPLATE_PATH) == load_yaml(SOURCE_PATH)


LOOP = """\
AWSTemplateFormatVersion: "2010-09-09"
Transform: [AWS::LanguageExtensions, AWS::Serverless-2016-10-31]
Mappings:
  Rows:
    Alpha: {Name: first}
    Beta: {Name: second}
Resources:
  # the queues
  Fn::ForEach::Queues:
    - Row
    - [Alpha, Beta]
    - ${Row}Queue:
        Type: AWS::SQS::Queue
        Properties:
          QueueName: !FindInMap [Rows, !Ref Row, Name]  # a literal key once written out

      ${Row}Policy:
        Type: AWS::SQS::QueuePolicy
        DependsOn: ${Row}Queue
        Properties:
          Queues: [!Ref {"Fn::Sub": "${Row}Queue"}]
          PolicyDocument:
            Statement:
              - Effect: Allow
                Principal: {Service: events.amazonaws.com}
                Action: sqs:SendMessage
                Resource: !GetAtt [!Sub "${Row}Queue", Arn]
                Sid: !Sub "${Row}-${AWS::Region}"

  Other:
    Type: AWS::SNS::Topic
"""


def test_a_loop_is_written_out_once_per_value_with_its_comments_and_plain_references(tmp_path: Path):
    text = generate(LOOP)
    assert "Fn::ForEach" not in text.split("\n", 3)[3].replace("# Fn::ForEach::Queues", "")
    assert "  # the queues\n" in text
    assert "# a literal key once written out" in text
    assert "  AlphaQueue:\n" in text
    assert "  BetaPolicy:\n" in text
    assert "Resource: !GetAtt BetaQueue.Arn" in text
    assert "Queues: [!Ref AlphaQueue]" in text
    assert "QueueName: !FindInMap [Rows, Beta, Name]" in text
    assert "DependsOn: AlphaQueue" in text
    written, source = tmp_path / "written.yaml", tmp_path / "source.yaml"
    written.write_text(text)
    source.write_text(LOOP)
    assert load_yaml(written) == load_yaml(source)
    assert list(load_yaml(written)["Resources"]) == [
        "AlphaQueue",
        "AlphaPolicy",
        "BetaQueue",
        "BetaPolicy",
        "Other",
    ]


@pytest.mark.parametrize(
    "broken",
    [
        LOOP.replace("    - Row\n", "    - [Row]\n"),  # not `- Identifier`
        LOOP.replace("    - [Alpha, Beta]\n", "    - !Ref RowNames\n"),  # a collection it cannot read
        LOOP.replace("    - ${Row}Queue:", "      - ${Row}Queue:"),  # the fragment misplaced
        LOOP.replace("  Other:\n", "  Other:\n    Fn::ForEach::Inner: []\n"),  # a loop inside a resource
    ],
)
def test_a_loop_the_generator_cannot_read_is_refused_never_half_written(broken: str):
    with pytest.raises(GenerationError):
        generate(broken)


def test_make_template_writes_it_and_the_makefile_says_how():
    assert "python -m tools.template.generate" in (ROOT / "Makefile").read_text()
    assert TEMPLATE_PATH.read_text().startswith("# GENERATED from template.source.yaml by `make template`")
