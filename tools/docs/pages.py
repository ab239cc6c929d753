"""Which file holds what: each generated file's expected text, from the template and the code."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tools.docs import asyncapi, openapi, reference
from tools.docs.cfn import ExpandedTemplate
from tools.docs.domain import ROOT

REFERENCE = ROOT / "docs" / "reference.md"
EVENTS = ROOT / "docs" / "events.md"
ASYNCAPI = ROOT / "docs" / "asyncapi.yaml"


class MarkerError(ValueError):
    pass


def splice(text: str, sections: dict[str, str], where: str = "page") -> str:
    """Replace what lies between `<!-- name:start -->` and `<!-- name:end -->` with each section's text."""
    for name, body in sections.items():
        start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
        if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
            raise MarkerError(f"{where}: needs exactly one {start} ... {end} pair")
        before, rest = text.split(start)
        _, after = rest.split(end)
        text = f"{before}{start}\n{body}\n{end}{after}"
    return text


def generators(template: ExpandedTemplate) -> dict[Path, Callable[[str], str]]:
    """Generated file -> its expected text, given its current text (prose outside markers is kept)."""
    return {
        REFERENCE: lambda text: splice(text, reference.tables(template), "docs/reference.md"),
        EVENTS: lambda text: splice(text, {"events": asyncapi.events_table(template)}, "docs/events.md"),
        ASYNCAPI: lambda _: asyncapi.render(asyncapi.document(template)),
        # The API contract, from the order API's resolver: the fuzzer reads the document, the handler the
        # request schemas.
        openapi.DOCUMENT: lambda _: openapi.render(openapi.generate()),
        openapi.request_schemas_file(): lambda _: openapi.render(openapi.contract().request_schemas()),
    }


def expected(template: ExpandedTemplate | None = None) -> dict[Path, str]:
    template = template or ExpandedTemplate.load()
    return {
        path: generate(path.read_text() if path.exists() else "")
        for path, generate in generators(template).items()
    }


def stale(template: ExpandedTemplate | None = None) -> list[Path]:
    return [
        path for path, text in expected(template).items() if not path.exists() or path.read_text() != text
    ]


def write(template: ExpandedTemplate | None = None) -> list[Path]:
    """Write every stale file; returns those written."""
    written = []
    for path, text in expected(template).items():
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            written.append(path)
    return written
