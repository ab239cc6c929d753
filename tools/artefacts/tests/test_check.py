"""tools/artefacts: what the arm64 python3.13 runtime loads, checked on small fake `sam build` outputs."""

from __future__ import annotations

import compileall
import importlib.metadata
import platform
import py_compile
import shutil
import struct
import sysconfig
from collections.abc import Iterable
from pathlib import Path

import pytest

from tools.artefacts import (
    LAMBDA_UNZIPPED_LIMIT,
    check_build,
    elf_problem,
    extension_problem,
    platform_problem,
    wheel_problems,
)
from tools.artefacts.__main__ import main
from tools.template import ROOT

REAL_BUILD = ROOT / ".aws-sam" / "build"
EM_X86_64 = 62
EM_AARCH64 = 183

# A sam build's template as .aws-sam/build/template.yaml has it: CodeUri/ContentUri name the artefact
# directories, and Globals gives every function the layer.
TEMPLATE = """\
Transform: AWS::Serverless-2016-10-31
Globals:
  Function:
    Runtime: python3.13
    Architectures: [arm64]
    Layers:
      - Ref: SharedLayer
Resources:
  SharedLayer:
    Type: AWS::Serverless::LayerVersion
    Properties:
      ContentUri: SharedLayer
      CompatibleArchitectures: [arm64]
  ApiFunction:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: ApiFunction
      Handler: app.lambda_handler
  RelayFunction:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: RelayFunction
      Handler: app.lambda_handler
  Queue:
    Type: AWS::SQS::Queue
"""


def elf(machine: int = EM_AARCH64, elf_class: int = 2, data: int = 1, size: int = 0) -> bytes:
    """A minimal ELF header (64 bytes, ET_DYN) padded with zeros to size."""
    order = "<" if data == 1 else ">"
    ident = b"\x7fELF" + bytes([elf_class, data, 1, 0]) + bytes(8)
    header = ident + struct.pack(f"{order}HHIQQQIHHHHHH", 3, machine, 1, 0, 64, 0, 0, 64, 56, 0, 64, 0, 0)
    assert len(header) == 64
    return header.ljust(size, b"\0")


def install(site: Path, dist: str, tags: list[str], files: dict[str, bytes]) -> None:
    """A wheel as pip installs it: its files and a dist-info whose WHEEL has the given Tag lines."""
    info = site / f"{dist}-1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    lines = ["Wheel-Version: 1.0", "Generator: test", "Root-Is-Purelib: false", *(f"Tag: {t}" for t in tags)]
    (info / "WHEEL").write_text("\n".join(lines) + "\n")
    for name, content in files.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_bytes(content)


@pytest.fixture
def build(tmp_path: Path) -> Path:
    """A good build: a native wheel (with a vendored library) in the layer, an abi3 one in a function."""
    root = tmp_path / "build"
    root.mkdir()
    (root / "template.yaml").write_text(TEMPLATE)
    layer = root / "SharedLayer" / "python"
    install(layer, "shop", ["py3-none-any"], {"shop/__init__.py": b""})
    install(
        layer,
        "wrapt",
        ["cp313-cp313-manylinux_2_17_aarch64", "cp313-cp313-manylinux2014_aarch64"],
        {
            "wrapt/__init__.py": b"",
            "wrapt/_wrappers.cpython-313-aarch64-linux-gnu.so": elf(),
            "wrapt.libs/libffi-1a2b3c4d.so.8.1": elf(),
        },
    )
    api = root / "ApiFunction"
    (api / "app.py").parent.mkdir()
    (api / "app.py").write_text("def lambda_handler(event, context): ...\n")
    install(api, "jsonschema_rs", ["cp310-abi3-manylinux_2_28_aarch64"], {"jsonschema_rs/x.abi3.so": elf()})
    (root / "RelayFunction").mkdir()
    (root / "RelayFunction" / "app.py").write_text("def lambda_handler(event, context): ...\n")
    # as layers/shared/Makefile compiles the layer (the functions' own code ships as source)
    checked_hash = py_compile.PycInvalidationMode.CHECKED_HASH
    assert compileall.compile_dir(layer, quiet=1, invalidation_mode=checked_hash)
    return root


def reasons(problems: Iterable[object]) -> str:
    return "\n".join(map(str, problems))


def test_a_good_build_has_no_problem_and_the_check_saw_everything(build: Path) -> None:
    report = check_build(build)
    assert report.ok, reasons(report.problems)
    assert set(report.function_sizes) == {"ApiFunction", "RelayFunction"}
    assert report.function_layers == {"ApiFunction": ("SharedLayer",), "RelayFunction": ("SharedLayer",)}
    assert sorted(report.native) == [
        "ApiFunction/jsonschema_rs/x.abi3.so",
        "SharedLayer/python/wrapt.libs/libffi-1a2b3c4d.so.8.1",
        "SharedLayer/python/wrapt/_wrappers.cpython-313-aarch64-linux-gnu.so",
    ]
    assert len(report.extensions) == 2
    assert set(report.wheels) == {
        "SharedLayer/python/shop-1.0.dist-info",
        "SharedLayer/python/wrapt-1.0.dist-info",
        "ApiFunction/jsonschema_rs-1.0.dist-info",
    }


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        (elf(machine=EM_X86_64), "built for x86-64 (e_machine 62)"),
        (elf(machine=40, elf_class=1), "32-bit ARM (e_machine 40), 32-bit"),
        (elf(data=2), "big-endian"),
        (b"/* GNU ld script */", "not an ELF file"),
    ],
)
def test_a_native_file_that_is_not_a_64_bit_little_endian_aarch64_elf_fails(
    build: Path, header: bytes, reason: str
) -> None:
    module = build / "SharedLayer/python/wrapt/_wrappers.cpython-313-aarch64-linux-gnu.so"
    module.write_bytes(header)
    problems = check_build(build).problems
    assert [str(p) for p in problems] == [f"{module.relative_to(build)}: {elf_problem(header)}"]
    assert reason in problems[0].reason


def test_a_vendored_x86_64_library_in_a_wheels_libs_dir_fails(build: Path) -> None:
    library = build / "SharedLayer/python/wrapt.libs/libffi-1a2b3c4d.so.8.1"
    library.write_bytes(elf(machine=EM_X86_64))
    assert [p.path for p in check_build(build).problems] == [library.relative_to(build).as_posix()]


def test_an_elf_file_with_no_so_name_is_checked_too(build: Path) -> None:
    (build / "ApiFunction" / "bin").mkdir()
    (build / "ApiFunction" / "bin" / "helper").write_bytes(elf(machine=EM_X86_64))
    assert [p.path for p in check_build(build).problems] == ["ApiFunction/bin/helper"]


def test_a_real_x86_64_shared_object_from_this_machine_fails(build: Path) -> None:
    # Given a native module of this (x86_64) machine's venv put where the aarch64 one was, under its name
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip(f"needs an x86_64 machine's shared objects; this one is {platform.machine()}")
    host = sorted(Path(sysconfig.get_paths()["platlib"]).rglob("*.so"))[0]
    module = build / "SharedLayer/python/wrapt/_wrappers.cpython-313-aarch64-linux-gnu.so"
    shutil.copyfile(host, module)
    # Then the header, not the name nor the wheel's tags, decides
    problems = check_build(build).problems
    assert len(problems) == 1, reasons(problems)
    assert problems[0].path == module.relative_to(build).as_posix()
    assert problems[0].reason.startswith("built for x86-64 (e_machine 62)")


def test_an_x86_64_wheel_substituted_into_a_copy_of_the_real_build_fails(tmp_path: Path) -> None:
    # The order API's own native wheel (functions/orders_api/requirements.txt), which the dev venv has
    # too (requirements-dev.txt), for this x86_64 machine.
    function, dist = "OrdersApiFunction", "jsonschema_rs"
    if not (REAL_BUILD / function / dist).is_dir():
        pytest.skip(f"no {function}/{dist} in {REAL_BUILD}: run `make build` (make test does it first)")
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip(f"needs an x86_64 machine's wheel; this one is {platform.machine()}")
    # Given a copy of the real build: that function copied, every other artefact linked
    copy = tmp_path / "build"
    copy.mkdir()
    shutil.copyfile(REAL_BUILD / "template.yaml", copy / "template.yaml")
    for artefact in REAL_BUILD.iterdir():
        if artefact.is_dir() and artefact.name != function:
            (copy / artefact.name).symlink_to(artefact, target_is_directory=True)
    shutil.copytree(REAL_BUILD / function, copy / function)
    assert check_build(copy).ok, "the real build should pass before the substitution"
    # When the built aarch64 wheel is replaced by this machine's installed one
    shutil.rmtree(copy / function / dist)
    for info in (copy / function).glob(f"{dist}-*.dist-info"):
        shutil.rmtree(info)
    host = importlib.metadata.distribution(dist)
    for file in host.files or []:
        if file.parts[0] == dist or file.parts[0].endswith(".dist-info"):
            target = copy / function / file
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(str(host.locate_file(file))), target)
    # Then the check fails on its module's header and on its wheel's tags, in that function only
    problems = check_build(copy).problems
    text = reasons(problems)
    assert problems, "a substituted x86_64 wheel passed the check"
    assert all(p.path.startswith(f"{function}/") for p in problems), text
    assert any(p.path.endswith(".so") and "x86-64 (e_machine 62)" in p.reason for p in problems), text
    assert any(p.path.endswith("/WHEEL") and "is for x86_64" in p.reason for p in problems), text


@pytest.mark.parametrize(
    "name",
    [
        "_speedups.cpython-312-aarch64-linux-gnu.so",
        "_speedups.cpython-313t-aarch64-linux-gnu.so",
        "_speedups.cpython-313-x86_64-linux-gnu.so",
        "_speedups.pypy310-pp73-aarch64-linux-gnu.so",
    ],
)
def test_an_extension_module_tagged_for_another_python_fails(build: Path, name: str) -> None:
    module = build / "SharedLayer/python/wrapt" / name
    module.write_bytes(elf())
    problems = check_build(build).problems
    assert [str(p) for p in problems] == [f"{module.relative_to(build)}: {extension_problem(name)}"]
    assert name.split(".")[1] in problems[0].reason


@pytest.mark.parametrize(
    "name", ["x.cpython-313-aarch64-linux-gnu.so", "x.abi3.so", "libpq-53e4e5f8.so.5.18", "libpython3.13.so"]
)
def test_the_runtimes_own_extension_tags_and_plain_libraries_pass(name: str) -> None:
    assert extension_problem(name) is None


@pytest.mark.parametrize(
    "tag",
    [
        "cp313-cp313-manylinux_2_17_aarch64",
        "cp313-cp313-manylinux2014_aarch64",
        "cp313-cp313-manylinux_2_34_aarch64",  # AL2023's own glibc
        "cp313-cp313-manylinux_2_17_aarch64.manylinux2014_aarch64",
        "cp310-abi3-manylinux_2_28_aarch64",
        "py3-none-any",
        "py2.py3-none-any",
    ],
)
def test_wheel_tags_the_runtime_loads_pass(tag: str) -> None:
    assert wheel_problems([tag]) == []


@pytest.mark.parametrize(
    ("tag", "reason"),
    [
        ("cp313-cp313-manylinux_2_35_aarch64", "needs glibc 2.35, newer than Amazon Linux 2023's 2.34"),
        ("cp313-cp313-manylinux_2_17_x86_64", "is for x86_64, the functions run on aarch64"),
        ("cp313-cp313-manylinux1_x86_64", "is for x86_64"),
        ("cp313-cp313-musllinux_1_2_aarch64", "is for musl libc"),
        ("cp313-cp313-linux_aarch64", "is not a manylinux tag"),
        ("cp313-cp313-macosx_11_0_arm64", "is not a manylinux tag"),
        ("cp312-cp312-manylinux_2_17_aarch64", "no tag for CPython 3.13 (cp312-cp312)"),
        ("py3-none-any-extra", "unreadable tag"),
    ],
)
def test_wheel_tags_the_runtime_cannot_load_fail(tag: str, reason: str) -> None:
    problems = wheel_problems([tag])
    assert problems, tag
    assert any(reason in problem for problem in problems), problems


def test_every_platform_a_wheel_claims_is_checked() -> None:
    assert wheel_problems(["cp313-cp313-manylinux_2_17_aarch64", "cp313-cp313-manylinux_2_39_aarch64"]) == [
        platform_problem("manylinux_2_39_aarch64")
    ]


def test_a_wheel_with_no_tag_line_fails() -> None:
    assert wheel_problems([]) == ["no Tag line: the wheel says nothing of where it runs"]


def test_a_bad_wheel_in_an_artefact_is_reported_at_its_wheel_file(build: Path) -> None:
    install(build / "ApiFunction", "fast", ["cp313-cp313-manylinux_2_17_x86_64"], {"fast/__init__.py": b""})
    assert [str(p) for p in check_build(build).problems] == [
        "ApiFunction/fast-1.0.dist-info/WHEEL: "
        "manylinux_2_17_x86_64 is for x86_64, the functions run on aarch64"
    ]


def test_the_size_limit_is_lambdas_250_mb_by_default() -> None:
    assert LAMBDA_UNZIPPED_LIMIT == 250 * 1024 * 1024 == 262_144_000
    assert check_build.__kwdefaults__ == {"limit": LAMBDA_UNZIPPED_LIMIT}


def test_a_function_over_the_limit_with_its_layers_fails(build: Path) -> None:
    # Given a limit that the layer (60 kB) and the API's own artefact (50 kB) each fit, not together
    (build / "SharedLayer" / "python" / "data.bin").write_bytes(bytes(60_000))
    (build / "ApiFunction" / "data.bin").write_bytes(bytes(50_000))
    limit = 100_000
    report = check_build(build, limit=limit)
    # Then only that function fails, with its size, its layer's and the limit
    assert report.function_sizes["RelayFunction"] <= limit < report.function_sizes["ApiFunction"]
    assert [p.path for p in report.problems] == ["ApiFunction"]
    reason = report.problems[0].reason
    assert reason.startswith(f"ApiFunction is {report.function_sizes['ApiFunction']:,} bytes unzipped")
    assert "SharedLayer 60," in reason
    assert reason.endswith("over Lambda's limit of 100,000 bytes")
    # And a function exactly at the limit passes
    assert check_build(build, limit=report.function_sizes["ApiFunction"]).ok


def test_a_functions_own_layers_are_counted_after_the_globals_ones(build: Path) -> None:
    # Given a second layer for one function only, and a layer that is not in the build
    template = (build / "template.yaml").read_text()
    extra = "  ExtraLayer:\n    Type: AWS::Serverless::LayerVersion\n"
    extra += "    Properties:\n      ContentUri: ExtraLayer\n"
    template = template.replace(
        "      CodeUri: RelayFunction\n",
        "      CodeUri: RelayFunction\n      Layers:\n        - Ref: ExtraLayer\n"
        "        - arn:aws:lambda:us-east-1:123456789012:layer:elsewhere:1\n",
    )
    (build / "template.yaml").write_text(template + extra)
    (build / "ExtraLayer" / "python").mkdir(parents=True)
    (build / "ExtraLayer" / "python" / "big.bin").write_bytes(bytes(50_000))
    report = check_build(build)
    assert report.function_layers["RelayFunction"] == ("SharedLayer", "ExtraLayer")
    assert report.function_sizes["RelayFunction"] > 50_000
    assert [str(p) for p in report.problems] == [
        "RelayFunction: RelayFunction's layer 'arn:aws:lambda:us-east-1:123456789012:layer:elsewhere:1' "
        "is not in this build: its size cannot be counted"
    ]


def test_a_function_whose_artefact_is_missing_fails(build: Path) -> None:
    shutil.rmtree(build / "RelayFunction")
    assert [str(p) for p in check_build(build).problems] == [
        "RelayFunction: RelayFunction's artefact is not a directory of this build"
    ]


def test_the_command_prints_a_summary_and_exits_0_on_a_good_build(
    build: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(build)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1
    assert out[0].startswith(
        "ok: 2 functions, 1 layer, 3 native files (2 extension modules), 3 wheels, "
        "2 layer modules with bytecode;"
    )


def test_the_command_prints_each_problem_and_exits_1(build: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (build / "ApiFunction/jsonschema_rs/x.abi3.so").write_bytes(elf(machine=EM_X86_64))
    (build / "ApiFunction/jsonschema_rs/y.cpython-312-aarch64-linux-gnu.so").write_bytes(elf())
    assert main([str(build)]) == 1
    captured = capsys.readouterr()
    assert [line.split(": ")[0] for line in captured.out.splitlines()] == [
        "ApiFunction/jsonschema_rs/x.abi3.so",
        "ApiFunction/jsonschema_rs/y.cpython-312-aarch64-linux-gnu.so",
    ]
    assert "2 problems" in captured.err


def test_the_command_says_when_there_is_no_build(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path)]) == 2
    assert "run `make build`" in capsys.readouterr().err


def pyc_of(module: Path) -> Path:
    return module.parent / "__pycache__" / f"{module.stem}.cpython-313.pyc"


def compile_as(module: Path, mode: py_compile.PycInvalidationMode) -> None:
    py_compile.compile(str(module), cfile=str(pyc_of(module)), invalidation_mode=mode, doraise=True)


def test_every_module_of_a_layer_is_checked_for_its_bytecode_and_the_functions_are_not(build: Path) -> None:
    report = check_build(build)
    assert sorted(report.compiled) == [
        "SharedLayer/python/shop/__init__.py",
        "SharedLayer/python/wrapt/__init__.py",
    ]
    assert pyc_of(build / "SharedLayer/python/shop/__init__.py").is_file()
    assert not (build / "ApiFunction" / "__pycache__").exists()


@pytest.mark.parametrize("mode", list(py_compile.PycInvalidationMode))
def test_a_layer_module_compiled_without_a_source_hash_fails_and_with_one_passes(
    build: Path, mode: py_compile.PycInvalidationMode
) -> None:
    module = build / "SharedLayer/python/shop/__init__.py"
    module.write_text("VALUE = 1\n")
    compile_as(module, mode)
    problems = check_build(build).problems
    if mode is py_compile.PycInvalidationMode.TIMESTAMP:
        assert [p.path for p in problems] == ["SharedLayer/python/shop/__init__.py"], reasons(problems)
        assert "timestamp-based" in problems[0].reason
        assert "1980-01-01" in problems[0].reason
    else:
        assert not problems, reasons(problems)


def test_a_layer_module_without_bytecode_fails(build: Path) -> None:
    module = build / "SharedLayer/python/shop/orders.py"
    module.write_text("ORDERS = ()\n")
    problems = check_build(build).problems
    assert [(p.path, p.reason.split(":")[0]) for p in problems] == [
        ("SharedLayer/python/shop/orders.py", "no .pyc")
    ]


def test_a_layer_module_changed_after_it_was_compiled_fails_as_stale(build: Path) -> None:
    module = build / "SharedLayer/python/wrapt/__init__.py"
    module.write_text("# edited in the build after compiling\n")
    problems = check_build(build).problems
    assert [p.path for p in problems] == ["SharedLayer/python/wrapt/__init__.py"], reasons(problems)
    assert "stale" in problems[0].reason


def test_bytecode_of_another_python_fails(build: Path) -> None:
    pyc = pyc_of(build / "SharedLayer/python/shop/__init__.py")
    header = bytearray(pyc.read_bytes())
    header[0:2] = (3495).to_bytes(2, "little")  # CPython 3.11's magic number
    pyc.write_bytes(bytes(header))
    problems = check_build(build).problems
    assert len(problems) == 1, reasons(problems)
    assert "magic number" in problems[0].reason
