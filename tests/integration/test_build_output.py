"""What `sam build` produces (make test builds first): complete, arm64, and able to run a handler."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tools.artefacts import check_build
from tools.local.reader.artefacts import build_for_host
from tools.template import ROOT, Template, load_yaml

BUILD_DIR = ROOT / ".aws-sam" / "build"


@pytest.fixture(scope="module")
def built() -> dict[str, Path]:
    if not (BUILD_DIR / "template.yaml").exists():
        pytest.fail("no build output: run `make build` (make test does it before these tests)")
    resources = load_yaml(BUILD_DIR / "template.yaml")["Resources"]
    paths = {}
    for name, resource in resources.items():
        props = resource.get("Properties", {})
        uri = props.get("CodeUri") or props.get("ContentUri")
        if isinstance(uri, str):
            paths[name] = BUILD_DIR / uri
    return paths


@pytest.fixture(scope="module")
def x86_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same template built for this machine's architecture, so its artefacts can be imported here."""
    return build_for_host(tmp_path_factory.mktemp("host-build"))


def test_every_function_and_the_layer_are_built(built: dict[str, Path], template: Template):
    for logical_id in template.functions():
        assert (built[logical_id] / "app.py").is_file(), logical_id
    layer = built["SharedLayer"] / "python"
    assert (layer / "shop" / "domain" / "orders.py").is_file()
    assert (layer / "aws_lambda_powertools").is_dir()


def test_operator_and_tooling_code_ships_in_no_artefact(built: dict[str, Path]):
    # Redrive and replay run from a checkout (python -m operations); no function calls them.
    shipped = {path.name for artefact in built.values() for path in artefact.rglob("*.py")}
    assert "recovery.py" not in shipped
    top_level = {path.name for artefact in built.values() for path in artefact.iterdir()}
    assert not top_level & {"operations", "tools"}


def test_native_wheels_in_the_layer_are_arm64(built: dict[str, Path]):
    native = list((built["SharedLayer"] / "python").rglob("*.so"))
    assert native, "expected native modules (wrapt's) in the layer"
    assert all("aarch64" in path.name for path in native), [p.name for p in native if "aarch64" not in p.name]


def test_every_artefact_is_what_the_arm64_python313_runtime_loads(built: dict[str, Path]):
    # aarch64 ELF only, CPython 3.13 extension tags, wheels for glibc <= 2.34 (AL2023), and each
    # function with its layers within Lambda's 250 MB unzipped (tools/artefacts/README.md)
    report = check_build(BUILD_DIR)
    assert report.ok, "\n".join(["python -m tools.artefacts found:", *map(str, report.problems)])
    assert report.extensions, "expected native extension modules (wrapt's, psycopg's, jsonschema-rs')"
    resources = load_yaml(BUILD_DIR / "template.yaml")["Resources"]
    functions = {name for name, r in resources.items() if r.get("Type") == "AWS::Serverless::Function"}
    assert functions <= set(built)
    assert set(report.function_sizes) == functions


def run_isolated(
    logical_id: str,
    search_path: list[str],
    script: str,
    env: dict[str, str],
    flags: tuple[str, ...] = (),
    arguments: tuple[str, ...] = (),
) -> str:
    """`script` in a clean interpreter (-I -S: no site-packages, and `flags`) with only `search_path` to
    import from; the last line it printed."""
    code = f"import sys; sys.path[:0] = {search_path!r}\n{script}"
    result = subprocess.run(
        [sys.executable, "-I", "-S", *flags, "-c", code, *arguments],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"{logical_id}: {result.stderr[-2000:]}"
    return result.stdout.strip().splitlines()[-1]


def test_built_artefacts_import_and_run_a_handler(x86_build: Path, template: Template):
    # Given each function's artefact with only its layer on the path, as in the Lambda runtime
    event = (ROOT / "events" / "api_create_order_invalid_fields.json").read_text()
    for logical_id, spec in template.functions().items():
        script = (
            "import json, sys\nimport app\nprint(json.dumps({'handler': callable(app.lambda_handler)}))\n"
        )
        if logical_id == "OrdersApiFunction":
            script += (
                "from tests_context import context\n"
                f"print(json.dumps(app.lambda_handler(json.loads({event!r}), context())))\n"
            )
        env = {
            "PATH": os.environ["PATH"],
            "PYTHONPATH": os.pathsep.join(
                [
                    str(x86_build / logical_id),
                    str(x86_build / "SharedLayer" / "python"),
                    str(ROOT / "tests" / "build_support"),
                ]
            ),
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
            "POWERTOOLS_TRACE_DISABLED": "true",
            "POWERTOOLS_METRICS_NAMESPACE": "BuildTest",
            **spec.environment,
        }
        # When the handler is imported (and, for the API, invoked) in a clean interpreter
        # (-I -S: no site-packages, only the artefact and its layer)
        last_line = run_isolated(logical_id, env["PYTHONPATH"].split(os.pathsep), script, env)
        # Then it imports with nothing but its artefact and the layer
        if logical_id == "OrdersApiFunction":
            response = json.loads(last_line)
            # (validated by jsonschema-rs, from the function's own requirements: the layer has no pydantic)
            assert response["statusCode"] == 422
            assert json.loads(response["body"])["error"]["code"] == "VALIDATION_FAILED"


# Counts what the interpreter compiles from source: importlib's SourceLoader calls the builtin compile()
# for a module whose .pyc is missing or does not validate.
_COUNT_COMPILES = """
import builtins, json, sys
layer = sys.argv[1]
compiled = []
_compile = builtins.compile
def counting(source, filename, *args, **kwargs):
    if str(filename).startswith(layer):
        compiled.append(str(filename)[len(layer):])
    return _compile(source, filename, *args, **kwargs)
builtins.compile = counting
import app
# vars(): reading an attribute of a module the runtime loads on first use would load it
files = [vars(module).get("__file__") or "" for module in list(sys.modules.values())]
print(json.dumps({"compiled": compiled, "loaded": sum(1 for f in files if f.startswith(layer))}))
"""


def test_no_cold_start_compiles_a_module_of_the_layer(x86_build: Path, template: Template, tmp_path: Path):
    # Given the layer as Lambda extracts it: `sam package` dates every zip entry 1980-01-01, and /opt is
    # read-only (-B: no .pyc written)
    layer = tmp_path / "opt" / "python"
    shutil.copytree(x86_build / "SharedLayer" / "python", layer)
    dated = datetime(1980, 1, 1, tzinfo=UTC).timestamp()
    for path in layer.rglob("*"):
        os.utime(path, (dated, dated))
    for logical_id, spec in template.functions().items():
        # When each function's handler module is imported in a fresh interpreter
        env = {"PATH": os.environ["PATH"], "AWS_REGION": "us-east-1", **spec.environment}
        search_path = [str(x86_build / logical_id), str(layer)]
        printed = run_isolated(logical_id, search_path, _COUNT_COMPILES, env, ("-B",), (str(layer),))
        imported = json.loads(printed)
        # Then every layer module it loads comes from the layer's bytecode: none is compiled
        assert imported["loaded"] > 100, imported
        assert imported["compiled"] == [], f"{logical_id} compiled {imported['compiled'][:10]}"
