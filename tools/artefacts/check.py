"""Check what `sam build` made (.aws-sam/build) against what the python3.13 arm64 runtime can load.

Three checks, each a list of `Problem`s naming the file and the reason (tools/artefacts/README.md has the
AWS sources of every number here):

1. Native code: every ELF file in a function or layer artefact (every `*.so` and `*.so.N`, and any other
   file that starts with the ELF magic) is a 64-bit little-endian ELF for aarch64 (e_machine 183), read
   from its header with `struct`; a CPython extension module's filename tag is `cpython-313-aarch64-linux-gnu`
   or the stable ABI's `abi3`.
2. Wheels: every `*.dist-info/WHEEL` has a tag that CPython 3.13 installs, and every platform tag it
   carries is `any` or a glibc manylinux tag for aarch64 whose glibc is at most Amazon Linux 2023's 2.34.
3. Size: each function's artefact with all of its layers, unzipped, is at most Lambda's 250 MB.
4. Bytecode: every module of a layer has CPython 3.13's hash-based `.pyc` beside it, recording its
   source's hash (PEP 552): Lambda cannot write one in the read-only /opt, and `sam package` dates
   every zip entry 1980-01-01, so a timestamp `.pyc` never validates there.

Functions and their layers come from the build's own template (`.aws-sam/build/template.yaml`), read
through `tools.template.load_yaml` (as the SAM transform receives it); the layers of a function are
the Globals' `Function.Layers` followed by its own `Layers`, as SAM merges them.
"""

from __future__ import annotations

import importlib.util
import os
import re
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

# Wheel tags are parsed by the `packaging` library (PyPA's own, what pip uses): `parse_tag` expands a
# compressed tag set, `cpython_tags`/`compatible_tags` give the interpreter/ABI pairs CPython 3.13 accepts.
# The glibc version of a manylinux platform tag is read below by PEP 600's pattern (packaging's own
# parser of it is private).
from packaging.tags import InvalidTag, Tag, compatible_tags, cpython_tags, parse_tag

from tools.template import load_yaml

# Lambda's unzipped limit for a function's deployment package and all of its layers, in bytes (250 MB,
# the CodeSizeUnzipped that GetAccountSettings reports): the Lambda quotas page.
LAMBDA_UNZIPPED_LIMIT = 262_144_000
# The python3.13 runtime: Amazon Linux 2023 (glibc 2.34), on arm64 here (template.yaml's Globals).
RUNTIME_GLIBC = (2, 34)
RUNTIME_ARCH = "aarch64"
PYTHON = (3, 13)
EXTENSION_TAGS = ("cpython-313-aarch64-linux-gnu", "abi3")

# PEP 552's .pyc header: the interpreter's magic number, flags (bit 0: hash-based), the source's hash.
# This check runs on the build's Python 3.13 (the venv's), so its magic number is the runtime's.
PYC_CACHE_TAG = f"cpython-{PYTHON[0]}{PYTHON[1]}"
PYC_HASH_BASED = 0b01

ELF_MAGIC = b"\x7fELF"
ELFCLASS64 = 2
ELFDATA2LSB = 1
EM_AARCH64 = 183
_MACHINES = {3: "x86 (i386)", 40: "32-bit ARM", 62: "x86-64", 183: "aarch64", 243: "RISC-V"}

# A shared object by name: `x.so`, and the versioned `libx-1a2b3c4d.so.3.1` that auditwheel vendors in
# a wheel's `<name>.libs/`.
_SHARED_OBJECT = re.compile(r"\.so(\.\d+)*$")
# A Python extension module's tag (PEP 3149, PEP 384): `name.cpython-313-aarch64-linux-gnu.so`,
# `name.abi3.so`; other interpreters' tags too, so that they are refused by name.
_EXTENSION_TAG = re.compile(r"\.(?P<tag>cpython-[^.]+|abi3|pypy[^.]*|graalpy[^.]*)\.so$")
# PEP 600 (manylinux_<glibc major>_<glibc minor>_<arch>) and the older names it keeps as aliases.
_MANYLINUX = re.compile(r"^manylinux_(?P<major>\d+)_(?P<minor>\d+)_(?P<arch>.+)$")
_LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}

# The (interpreter, ABI) pairs that pip on CPython 3.13 installs: cp313-cp313, cp3x-abi3, py3-none, ...
_PYTHON_313 = {
    (tag.interpreter, tag.abi)
    for tag in chain(
        cpython_tags(PYTHON, abis=[f"cp{PYTHON[0]}{PYTHON[1]}"], platforms=["any"]),
        compatible_tags(PYTHON, f"cp{PYTHON[0]}{PYTHON[1]}", ["any"]),
    )
}


@dataclass(frozen=True)
class Problem:
    path: str  # relative to the build directory
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


@dataclass
class Report:
    """What the check saw, and what it found wrong."""

    problems: list[Problem] = field(default_factory=list)
    # Each function's unzipped bytes with its layers, and those layers' logical ids.
    function_sizes: dict[str, int] = field(default_factory=dict)
    function_layers: dict[str, tuple[str, ...]] = field(default_factory=dict)
    layers: tuple[str, ...] = ()
    native: list[str] = field(default_factory=list)  # every ELF file checked
    extensions: list[str] = field(default_factory=list)  # the Python extension modules among them
    wheels: dict[str, tuple[str, ...]] = field(default_factory=dict)  # dist-info -> its Tag lines
    compiled: list[str] = field(default_factory=list)  # the layers' modules checked for bytecode
    limit: int = LAMBDA_UNZIPPED_LIMIT

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        largest = max(self.function_sizes.items(), key=lambda item: item[1], default=("none", 0))
        counts = (
            _count(len(self.function_sizes), "function"),
            _count(len(self.layers), "layer"),
            f"{_count(len(self.native), 'native file')} ({_count(len(self.extensions), 'extension module')})",
            _count(len(self.wheels), "wheel"),
            f"{_count(len(self.compiled), 'layer module')} with bytecode",
        )
        return (
            f"{', '.join(counts)}; largest function with its layers: {largest[0]}, "
            f"{largest[1] / 2**20:.1f} MiB of {self.limit / 2**20:.1f} MiB"
        )


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def elf_problem(header: bytes) -> str | None:
    """Why an ELF header is not loadable by the arm64 runtime, or None when it is."""
    if len(header) < 20 or not header.startswith(ELF_MAGIC):
        return "not an ELF file"
    elf_class, data = header[4], header[5]
    order = ">" if data == 2 else "<"
    (machine,) = struct.unpack_from(f"{order}H", header, 18)
    wrong = []
    if machine != EM_AARCH64:
        wrong.append(f"built for {_MACHINES.get(machine, 'another machine')} (e_machine {machine})")
    if elf_class != ELFCLASS64:
        wrong.append(f"{'32' if elf_class == 1 else 'unknown'}-bit (EI_CLASS {elf_class})")
    if data != ELFDATA2LSB:
        wrong.append(f"{'big' if data == 2 else 'unknown'}-endian (EI_DATA {data})")
    if not wrong:
        return None
    return f"{', '.join(wrong)}: Lambda arm64 loads 64-bit little-endian aarch64 ELF (e_machine {EM_AARCH64})"


def extension_problem(name: str) -> str | None:
    """Why a Python extension module's filename tag is not CPython 3.13's on aarch64, or None."""
    match = _EXTENSION_TAG.search(name)
    if match is None or match["tag"] in EXTENSION_TAGS:
        return None
    return (
        f"extension module tagged {match['tag']}: the python3.13 runtime imports "
        f"{' or '.join(EXTENSION_TAGS)} only"
    )


def platform_problem(platform: str) -> str | None:
    """Why a wheel platform tag is not loadable on Amazon Linux 2023 aarch64, or None."""
    if platform == "any":
        return None
    if platform.startswith("musllinux_"):
        return f"{platform} is for musl libc: the runtime's Amazon Linux 2023 has glibc"
    match = _MANYLINUX.match(platform)
    if match:
        glibc, arch = (int(match["major"]), int(match["minor"])), match["arch"]
    else:
        legacy, _, arch = platform.partition("_")
        if legacy not in _LEGACY_MANYLINUX:
            return f"{platform} is not a manylinux tag: it promises no glibc the runtime has"
        glibc = _LEGACY_MANYLINUX[legacy]
    wrong = []
    if arch != RUNTIME_ARCH:
        wrong.append(f"{platform} is for {arch}, the functions run on {RUNTIME_ARCH}")
    if glibc > RUNTIME_GLIBC:
        wrong.append(
            f"{platform} needs glibc {glibc[0]}.{glibc[1]}, newer than Amazon Linux 2023's "
            f"{RUNTIME_GLIBC[0]}.{RUNTIME_GLIBC[1]}"
        )
    return "; ".join(wrong) or None


def wheel_problems(tag_lines: Iterable[str]) -> list[str]:
    """Why a wheel with these `Tag:` values is not for CPython 3.13 on AL2023 aarch64 (empty: it is)."""
    tags: set[Tag] = set()
    reasons = []
    for line in tag_lines:
        try:
            tags |= parse_tag(line)
        except InvalidTag as exc:
            reasons.append(f"unreadable tag {line!r}: {exc}")
    if not tags:
        return [*reasons, "no Tag line: the wheel says nothing of where it runs"]
    # The interpreter tags are alternatives (py2.py3: either); every platform the wheel claims must do.
    if not any((tag.interpreter, tag.abi) in _PYTHON_313 for tag in tags):
        found = ", ".join(sorted({f"{tag.interpreter}-{tag.abi}" for tag in tags}))
        reasons.append(f"no tag for CPython 3.13 ({found})")
    for platform in sorted({tag.platform for tag in tags}):
        reason = platform_problem(platform)
        if reason:
            reasons.append(reason)
    return reasons


def bytecode_problem(source: bytes, pyc_header: bytes | None) -> str | None:
    """Why a module's .pyc (its first 16 bytes; None: there is none) will not serve on Lambda, or None."""
    if pyc_header is None:
        return "no .pyc: Lambda compiles this module at every cold start (/opt is read-only)"
    if len(pyc_header) < 16 or pyc_header[:4] != importlib.util.MAGIC_NUMBER:
        return f"its .pyc is not CPython {PYTHON[0]}.{PYTHON[1]}'s bytecode (magic number)"
    if not int.from_bytes(pyc_header[4:8], "little") & PYC_HASH_BASED:
        return (
            "its .pyc is timestamp-based: `sam package` dates the source 1980-01-01, so on Lambda it never "
            "validates (compile with --invalidation-mode checked-hash or unchecked-hash)"
        )
    if pyc_header[8:16] != importlib.util.source_hash(source):
        return "its .pyc was compiled from another version of this source (stale)"
    return None


def check_bytecode(build_dir: Path, layer: Path, report: Report) -> None:
    """Check 4 over one layer artefact."""
    for path in _files(layer):
        if path.suffix != ".py" or "__pycache__" in path.parts:
            continue
        where = path.relative_to(build_dir).as_posix()
        report.compiled.append(where)
        pyc = path.parent / "__pycache__" / f"{path.stem}.{PYC_CACHE_TAG}.pyc"
        header = None
        if pyc.is_file():
            with pyc.open("rb") as file:
                header = file.read(16)
        reason = bytecode_problem(path.read_bytes(), header)
        if reason:
            report.problems.append(Problem(where, reason))


def _files(top: Path) -> Iterator[Path]:
    """Every file under top (a symlink to a directory at the top is followed, below it is not)."""
    for root, dirs, files in os.walk(top):
        dirs.sort()
        for name in sorted(files):
            yield Path(root, name)


def tree_size(top: Path) -> int:
    """Bytes of every file under top, as Lambda extracts them (a symlinked file counts its target)."""
    return sum(path.stat().st_size for path in _files(top) if path.is_file())


def _layer_references(value: Any) -> list[Any]:
    """The layers a `Layers` list names: each Ref's target (both branches of an Fn::If), or the value."""
    if isinstance(value, list):
        return [ref for item in value for ref in _layer_references(item)]
    if isinstance(value, dict) and set(value) == {"Ref"}:
        return [] if str(value["Ref"]).startswith("AWS::") else [value["Ref"]]
    if isinstance(value, dict) and set(value) == {"Fn::If"} and isinstance(value["Fn::If"], list):
        return _layer_references(value["Fn::If"][1:])
    return [] if value is None else [value]


# The resources that have an artefact directory in the build, and the property that names it.
_ARTEFACT_PROPERTY = {"AWS::Serverless::Function": "CodeUri", "AWS::Serverless::LayerVersion": "ContentUri"}


@dataclass(frozen=True)
class BuildLayout:
    functions: dict[str, Path]  # logical id -> artefact directory
    layers: dict[str, Path]
    function_layers: dict[str, tuple[str, ...]]
    problems: list[Problem]


def read_layout(build_dir: Path) -> BuildLayout:
    """Each function's artefact and its layers' artefacts, from the build's template."""
    data = load_yaml(build_dir / "template.yaml")
    resources: dict[str, Any] = data.get("Resources") or {}
    problems: list[Problem] = []
    functions: dict[str, Path] = {}
    layers: dict[str, Path] = {}
    for name, resource in resources.items():
        kind = resource.get("Type") if isinstance(resource, dict) else None
        if kind not in _ARTEFACT_PROPERTY:
            continue
        props = resource.get("Properties") or {}
        if "InlineCode" in props or props.get("PackageType") == "Image":
            continue  # no directory of the build: code in the template, or a container image
        uri = props.get(_ARTEFACT_PROPERTY[kind])
        if not isinstance(uri, str) or not (build_dir / uri).is_dir():
            where = uri if isinstance(uri, str) else name
            problems.append(Problem(where, f"{name}'s artefact is not a directory of this build"))
            continue
        (layers if kind == "AWS::Serverless::LayerVersion" else functions)[name] = build_dir / uri
    global_layers = ((data.get("Globals") or {}).get("Function") or {}).get("Layers")
    function_layers: dict[str, tuple[str, ...]] = {}
    for name, path in functions.items():
        props = resources[name].get("Properties") or {}
        names: list[str] = []
        for ref in _layer_references([global_layers, props.get("Layers")]):
            if not (isinstance(ref, str) and ref in layers):
                reason = f"{name}'s layer {ref!r} is not in this build: its size cannot be counted"
                problems.append(Problem(path.relative_to(build_dir).as_posix(), reason))
            elif ref not in names:
                names.append(ref)
        function_layers[name] = tuple(names)
    return BuildLayout(functions, layers, function_layers, problems)


def check_artefact(build_dir: Path, artefact: Path, report: Report) -> None:
    """Checks 1 and 2 over one artefact directory, adding what it sees to the report."""
    for path in _files(artefact):
        where = path.relative_to(build_dir).as_posix()
        if path.name == "WHEEL" and path.parent.name.endswith(".dist-info"):
            lines = path.read_text(errors="replace").splitlines()
            tags = tuple(line.partition(":")[2].strip() for line in lines if line.startswith("Tag:"))
            report.wheels[path.parent.relative_to(build_dir).as_posix()] = tags
            report.problems.extend(Problem(where, reason) for reason in wheel_problems(tags))
            continue
        with path.open("rb") as file:
            header = file.read(64)
        if not (_SHARED_OBJECT.search(path.name) or header.startswith(ELF_MAGIC)):
            continue
        report.native.append(where)
        reason = elf_problem(header)
        if reason:
            report.problems.append(Problem(where, reason))
        if _EXTENSION_TAG.search(path.name):
            report.extensions.append(where)
            reason = extension_problem(path.name)
            if reason:
                report.problems.append(Problem(where, reason))


def check_build(build_dir: Path, *, limit: int = LAMBDA_UNZIPPED_LIMIT) -> Report:
    """All four checks over a `sam build` output directory (limit: the unzipped bytes allowed)."""
    build_dir = Path(build_dir)
    layout = read_layout(build_dir)
    report = Report(
        problems=list(layout.problems),
        function_layers=dict(layout.function_layers),
        layers=tuple(layout.layers),
        limit=limit,
    )
    for artefact in sorted({*layout.functions.values(), *layout.layers.values()}):
        check_artefact(build_dir, artefact, report)
    for layer in sorted(set(layout.layers.values())):
        check_bytecode(build_dir, layer, report)
    sizes = {path: tree_size(path) for path in {*layout.functions.values(), *layout.layers.values()}}
    for name, path in layout.functions.items():
        layers = layout.function_layers[name]
        total = sizes[path] + sum(sizes[layout.layers[layer]] for layer in layers)
        report.function_sizes[name] = total
        if total > limit:
            parts = ", ".join(f"{part} {sizes[layout.layers[part]]:,}" for part in layers) or "no layer"
            report.problems.append(
                Problem(
                    path.relative_to(build_dir).as_posix(),
                    f"{name} is {total:,} bytes unzipped with its layers (itself {sizes[path]:,}; {parts}), "
                    f"over Lambda's limit of {limit:,} bytes",
                )
            )
    return report
