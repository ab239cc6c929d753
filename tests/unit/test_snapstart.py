"""SnapStart: the template parameter switches it (and the alias it needs) for every function, and the code
stays correct when many execution environments resume from one snapshot (shop/runtime/snapstart.py).

SnapStart itself is not emulated locally: these tests check what the template asks of AWS, as SAM
translates it, and what the code does at import and after a restore.
"""

from __future__ import annotations

import ast
import copy
import random
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from samcli.lib.cfn_language_extensions.api import process_template  # type: ignore[import-untyped]
from samtranslator.translator.transform import transform  # type: ignore[import-untyped]

from shop.runtime import snapstart
from tools.template import ROOT, TEMPLATE_PATH, Template, load_yaml

ALIAS = "live"


class _NoManagedPolicies:
    """The template attaches no AWS managed policy, so SAM never needs their ARNs."""

    def load(self) -> dict[str, str]:
        return {}


def translated(snap_start: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The CloudFormation resources SAM makes of template.yaml for this SnapStart value: the language
    extensions first (as CloudFormation runs them, with the parameter's value), then the SAM transform."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    parameters = {"SnapStart": snap_start}
    expanded = process_template(copy.deepcopy(load_yaml(TEMPLATE_PATH)), parameter_values=parameters)
    expanded["Transform"] = "AWS::Serverless-2016-10-31"
    for resource in expanded["Resources"].values():  # SAM wants built artefacts: any S3 location will do
        if resource["Type"] == "AWS::Serverless::Function":
            resource["Properties"]["CodeUri"] = "s3://bucket/function.zip"
        if resource["Type"] == "AWS::Serverless::LayerVersion":
            resource["Properties"]["ContentUri"] = "s3://bucket/layer.zip"
    pseudo = {"AWS::Region": "us-east-1", "AWS::Partition": "aws", "AWS::AccountId": "123456789012"}
    output: dict[str, Any] = transform(expanded, {**parameters, **pseudo}, _NoManagedPolicies())
    resources: dict[str, Any] = output["Resources"]
    return resources


def of_type(resources: dict[str, Any], resource_type: str) -> dict[str, dict[str, Any]]:
    return {k: v["Properties"] for k, v in resources.items() if v["Type"] == resource_type}


def test_every_function_is_python_and_snapstart_is_off_by_default(template: Template):
    assert template.data["Parameters"]["SnapStart"]["Default"] == "None"
    assert set(template.data["Parameters"]["SnapStart"]["AllowedValues"]) == {"None", "PublishedVersions"}
    assert {spec.runtime for spec in template.functions().values()} == {"python3.13"}


@pytest.mark.parametrize("snap_start", ["None", "PublishedVersions"])
def test_the_parameter_switches_snapstart_and_the_alias_of_every_function(
    template: Template, monkeypatch: pytest.MonkeyPatch, snap_start: str
):
    resources = translated(snap_start, monkeypatch)
    functions = of_type(resources, "AWS::Lambda::Function")
    assert set(functions) == set(template.functions())
    for properties in functions.values():
        assert properties["SnapStart"] == {"ApplyOn": {"Ref": "SnapStart"}}

    aliases = of_type(resources, "AWS::Lambda::Alias")
    mappings = of_type(resources, "AWS::Lambda::EventSourceMapping")
    permissions = of_type(resources, "AWS::Lambda::Permission")
    assert mappings, "the relay and the consumers are invoked by event source mappings"
    assert permissions, "API Gateway is allowed to invoke the API function"
    if snap_start == "None":
        # Only a function that always publishes versions for a reason of its own has an alias then: the
        # order database's migration function, whose new version re-runs the schema's custom resource.
        assert {a["FunctionName"]["Ref"] for a in aliases.values()} == {"OrderDatabaseMigrationFunction"}
        invoked = {p["FunctionName"]["Ref"] for p in (*mappings.values(), *permissions.values())}
        assert invoked <= set(functions)
        return
    # Snapshots exist for published versions only: each function gets a version behind the alias,
    # and whatever invokes a function invokes the alias, never $LATEST.
    assert {a["FunctionName"]["Ref"]: a["Name"] for a in aliases.values()} == dict.fromkeys(functions, ALIAS)
    for alias in aliases.values():
        version = alias["FunctionVersion"]["Fn::GetAtt"][0]
        assert resources[version]["Type"] == "AWS::Lambda::Version"
        # A replaced version goes, and its cached snapshot (billed per GB-s) with it.
        assert resources[version]["DeletionPolicy"] == "Delete"
    for invoker in (*mappings.values(), *permissions.values()):
        assert invoker["FunctionName"]["Ref"] in aliases
    api_body = str(of_type(resources, "AWS::ApiGateway::RestApi")["OrdersApi"]["Body"])
    assert "${OrdersApiFunctionAliaslive}" in api_body
    assert "${OrdersApiFunction.Arn}" not in api_body


# --- nothing unique is computed at import (it would be in the snapshot, the same everywhere) -------

# Calls whose result is unique or time-dependent: at import they would be frozen into a snapshot.
UNIQUE_CALLS = frozenset(
    {
        "uuid1",
        "uuid4",
        "urandom",
        "token_bytes",
        "token_hex",
        "token_urlsafe",
        "getrandbits",
        "randbytes",
        "randint",
        "randrange",
        "random",
        "choice",
        "uniform",
        "time",
        "time_ns",
        "now",
        "utcnow",
        "today",
    }
)


def _called_name(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return ""


def calls_at_import(source: str) -> list[tuple[int, str]]:
    """(line, name) of each unique-value call that runs when the module is imported: module and class
    bodies, decorators and default values; not the bodies of functions, which run later."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for evaluated in (*node.decorator_list, *node.args.defaults, *node.args.kw_defaults):
                if evaluated is not None:
                    visit(evaluated)
            return
        if isinstance(node, ast.Lambda):
            return
        if isinstance(node, ast.Call) and _called_name(node) in UNIQUE_CALLS:
            found.append((node.lineno, _called_name(node)))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return found


def deployed_modules() -> list[Path]:
    shop = ROOT / "layers" / "shared" / "shop"
    return sorted([*(ROOT / "functions").glob("*/*.py"), *shop.rglob("*.py")])


@pytest.mark.parametrize("module", deployed_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_deployed_module_computes_a_unique_value_at_import(module: Path):
    assert calls_at_import(module.read_text()) == []


@pytest.mark.parametrize(
    "source",
    [
        "import uuid\nINSTANCE_ID = uuid.uuid4().hex\n",
        "import random\nclass Jitter:\n    seed = random.random()\n",
        "from datetime import datetime, UTC\nSTARTED = datetime.now(UTC)\n",
        "import os\ndef f(token=os.urandom(8)):\n    return token\n",
    ],
)
def test_a_unique_value_made_at_import_is_caught(source: str):
    assert calls_at_import(source) != []


def test_a_unique_value_made_per_call_is_allowed():
    assert calls_at_import("import uuid\ndef new_id():\n    return uuid.uuid4().hex\n") == []


# --- the restore hook -------------------------------------------------------------------------------


def test_in_the_lambda_runtime_random_is_reseeded_after_each_restore(monkeypatch: pytest.MonkeyPatch):
    registered: list[Any] = []
    runtime_library = types.ModuleType("snapshot_restore_py")
    runtime_library.register_after_restore = registered.append  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "snapshot_restore_py", runtime_library)

    assert snapstart.register_restore_hooks() is True
    assert registered == [snapstart.reseed_after_restore]

    random.seed(15)  # the state every environment restored from one snapshot would share
    shared = random.getstate()
    registered[0]()
    assert random.getstate() != shared


def test_outside_lambda_no_hook_is_registered(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "snapshot_restore_py", None)  # import fails, as off Lambda
    assert snapstart.register_restore_hooks() is False
