"""The layers of the shop package, checked on the source: every import statement (at any depth, in
TYPE_CHECKING blocks too, relative ones resolved) of every module.

    shop.domain    the standard library and shop.domain only (so never boto3, botocore, Powertools,
                   shop.adapters or shop.runtime)
    shop.adapters  never shop.runtime; shop.adapters.postgres none of the other adapters (the DynamoDB
                   ones among them), shop.adapters.dynamodb nothing of shop.adapters.postgres: the two
                   stores stand side by side on the domain
    shop.runtime   no SQL (shop.adapters.postgres holds it), and the logical relay shares the publishing
                   core (shop.runtime.outbox_publishing), not the polling publisher's module
    operations     imported only by operations/, tools/ and the tests that exercise it: no shipped code
                   (the layer, the functions) and no other code depends on operator commands
    tests/unit     the product's unit tests stand alone: of tools/ they import only the template reader
                   (tools.template), the IAM evaluation of the template (tools.iam, which itself
                   imports nothing else of tools/ but tools.template) and the embedded PostgreSQL's start
                   (tools.local.services.embedded_postgres, which imports nothing else of tools/), never
                   the local stack, chaos, bench or docs tooling; of tests/ only their own modules,
                   tests/support and tests/conftest.py. tests/conftest.py is held to the same rule for
                   what loading it runs (its local-stack fixtures import the stack only when a test asks
                   for one).
    tests          imported by test code only (pytest's: a tests/ folder, a test_*.py, a conftest.py):
                   tools, operator and shipped code never import test code
    operations     no branch on the store's name (`== "postgres"`, `== "dynamodb"`): what differs per
                   store is answered by the poison record's position and the Protocols
    tools          no import circle between its modules, every import statement counted (TYPE_CHECKING
                   and function-level ones too: a reader follows them as well); in tools/local the
                   stack hands the inspector, and the console its printer, what they need through
                   Protocols
and the key design stays in one module: no shipped or operator code but shop/adapters/dynamodb/keys.py
spells a key prefix.
"""

from __future__ import annotations

import ast
import graphlib
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tools.template import ROOT

SHOP = ROOT / "layers" / "shared" / "shop"
DOMAIN_NEVER = ("boto3", "botocore", "aws_lambda_powertools", "shop.adapters", "shop.runtime")
STORE_NAMES = ("dynamodb", "postgres")  # the template's OrderStore values
KEY_PREFIXES = ("ORDER#", "REQUEST#", "SKU#", "RESERVATION#", "OUTBOX#")
PRODUCT_TEST_MODULES = ("tests.unit", "tests.support", "tests.conftest")
# What of tools/ the product's unit tests may import, and what of tools/ each of those imports itself.
PRODUCT_TEST_TOOLS = {
    "tools.template": (),
    "tools.iam": ("tools.template",),
    "tools.local.services.embedded_postgres": (),
}
# A statement in a string literal: what only shop.adapters.postgres may hold.
SQL = re.compile(r"\b(SELECT|UPDATE|INSERT INTO|DELETE FROM|SET LOCAL|LOCK TABLE)\b")
# Environments and output (.gitignore): `make bench` builds the functions, their dependencies with them,
# into .bench/cold-start.
NOT_PROJECT_CODE = {
    ".venv",
    ".venv-scan",
    ".aws-sam",
    ".mutation",
    "mutants",
    "node_modules",
    ".git",
    ".bench",
    ".chaos",
    ".local-data",
}


def module_name(path: Path, source_root: Path) -> str:
    parts = list(path.relative_to(source_root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def run_when_loaded(node: ast.AST) -> Iterator[ast.AST]:
    """The nodes under `node` that importing the module executes: not function bodies, not the body of
    an `if TYPE_CHECKING:` block."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(child, ast.If) and ast.unparse(child.test) in {"TYPE_CHECKING", "typing.TYPE_CHECKING"}:
            for statement in child.orelse:
                yield statement
                yield from run_when_loaded(statement)
            continue
        yield child
        yield from run_when_loaded(child)


def imports(path: Path, source_root: Path, when_loaded: bool = False) -> Iterator[str]:
    """Every module an import statement of `path` names; `from a import b` names a and a.b. With
    `when_loaded`, only the statements importing `path` runs."""
    module = module_name(path, source_root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in run_when_loaded(tree) if when_loaded else ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names if alias.name != "*")


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def violations(
    files: list[Path], source_root: Path, forbidden: Callable[[str], bool], when_loaded: bool = False
) -> list[str]:
    return sorted(
        f"{path.relative_to(source_root)} imports {name}"
        for path in files
        for name in set(imports(path, source_root, when_loaded))
        if forbidden(name)
    )


def domain_may_not_import(name: str) -> bool:
    top = name.partition(".")[0]
    if any(within(name, never) for never in DOMAIN_NEVER):
        return True
    return not (within(name, "shop.domain") or top in sys.stdlib_module_names or name == "shop")


def adapters_may_not_import(name: str) -> bool:
    return within(name, "shop.runtime")


def postgres_adapter_may_not_import(name: str) -> bool:
    return (
        within(name, "shop.adapters")
        and name != "shop.adapters"
        and not within(name, "shop.adapters.postgres")
    )


def dynamodb_adapter_may_not_import(name: str) -> bool:
    return within(name, "shop.adapters.postgres")


def product_tests_may_not_import(name: str) -> bool:
    if within(name, "tools"):
        return name != "tools" and not any(within(name, allowed) for allowed in PRODUCT_TEST_TOOLS)
    if within(name, "tests"):
        return name != "tests" and not any(within(name, own) for own in PRODUCT_TEST_MODULES)
    return False


def python_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if not NOT_PROJECT_CODE & set(p.relative_to(root).parts))


def tool_files(tool: str) -> list[Path]:
    """What importing `tool` may run: a package's modules, or a module and its packages' __init__.py."""
    path = ROOT.joinpath(*tool.split("."))
    if path.is_dir():
        return python_files(path)
    packages = [
        ROOT.joinpath(*tool.split(".")[:depth], "__init__.py") for depth in range(1, tool.count(".") + 1)
    ]
    return [path.with_suffix(".py"), *packages]


def is_test_code(path: Path, source_root: Path) -> bool:
    """pytest's files: anything under a tests/ folder, a test_*.py module, a conftest.py."""
    folders = path.relative_to(source_root).parts[:-1]
    return "tests" in folders or path.name.startswith("test_") or path.name == "conftest.py"


def import_circle(files: list[Path], source_root: Path) -> list[str]:
    """One circle of imports among the modules of `files` (the first module repeated at its end), or []:
    every import statement counts, in TYPE_CHECKING blocks and functions too."""
    modules = {module_name(path, source_root): path for path in files}
    graph = {
        module: {name for name in imports(path, source_root) if name in modules and name != module}
        for module, path in modules.items()
    }
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as circle:
        return list(circle.args[1])
    return []


# --- the rules ---------------------------------------------------------------------------------------------
def test_the_domain_imports_only_the_standard_library_and_itself():
    files = python_files(SHOP / "domain")
    assert len(files) >= 10  # the package is where this test looks for it
    assert violations(files, SHOP.parent, domain_may_not_import) == []


def test_adapters_never_import_the_runtime():
    files = python_files(SHOP / "adapters")
    assert len(files) >= 10
    assert violations(files, SHOP.parent, adapters_may_not_import) == []


def test_the_postgres_adapter_imports_none_of_the_other_adapters():
    files = python_files(SHOP / "adapters" / "postgres")
    assert len(files) >= 10
    assert violations(files, SHOP.parent, postgres_adapter_may_not_import) == []


def test_the_dynamodb_adapter_imports_nothing_of_the_postgres_adapter():
    files = python_files(SHOP / "adapters" / "dynamodb")
    assert len(files) >= 5
    assert violations(files, SHOP.parent, dynamodb_adapter_may_not_import) == []


def test_the_logical_relay_imports_nothing_of_the_polling_publisher():
    files = [SHOP / "runtime" / "logical_relay.py"]
    assert "shop.runtime.outbox_publishing" in set(imports(files[0], SHOP.parent))
    assert violations(files, SHOP.parent, lambda name: within(name, "shop.runtime.polling_publisher")) == []


def sql_in(path: Path) -> list[str]:
    """What of `path` holds SQL: string literals spelling a statement (docstrings, which only describe
    them, aside), and calls of a cursor's execute."""
    tree = ast.parse(path.read_text())
    prose = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    found = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in prose
        and SQL.search(node.value)
    ]
    found += [
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in {"execute", "executemany"}
    ]
    return found


def test_no_runtime_module_holds_sql():
    files = python_files(SHOP / "runtime")
    assert len(files) >= 15
    held = {str(path.relative_to(SHOP)): found for path in files if (found := sql_in(path))}
    assert held == {}
    assert sql_in(SHOP / "adapters" / "postgres" / "outbox.py")  # where it is, it finds it


def test_only_operator_code_tools_and_their_tests_import_operations():
    outside = [
        path
        for path in python_files(ROOT)
        if path.relative_to(ROOT).parts[0] not in {"operations", "tools", "tests"}
    ]
    assert any(path.is_relative_to(SHOP) for path in outside)
    assert any(path.is_relative_to(ROOT / "functions") for path in outside)
    assert violations(outside, ROOT, lambda name: within(name, "operations")) == []


def test_product_unit_tests_import_no_tooling_but_the_template_reader():
    files = [*python_files(ROOT / "tests" / "unit"), *python_files(ROOT / "tests" / "support")]
    assert len(files) >= 15
    assert violations(files, ROOT, product_tests_may_not_import) == []
    # tests/conftest.py is loaded for every layer: what loading it runs obeys the same rule.
    conftest = [ROOT / "tests" / "conftest.py"]
    assert "tools.template" in set(imports(conftest[0], ROOT, when_loaded=True))
    assert violations(conftest, ROOT, product_tests_may_not_import, when_loaded=True) == []


def test_the_tools_the_product_tests_use_import_no_other_tooling():
    for tool, may_import in PRODUCT_TEST_TOOLS.items():
        files = tool_files(tool)
        assert files, tool
        assert all(path.is_file() for path in files), tool

        def forbidden(name: str, allowed: tuple[str, ...] = (tool, *may_import)) -> bool:
            return within(name, "tools") and name != "tools" and not any(within(name, a) for a in allowed)

        assert violations(files, ROOT, forbidden) == [], tool


def test_no_code_but_test_code_imports_the_tests():
    code = [path for path in python_files(ROOT) if not is_test_code(path, ROOT)]
    assert any(path.is_relative_to(ROOT / "tools") for path in code)
    assert not any(path.is_relative_to(ROOT / "tests") for path in code)
    assert violations(code, ROOT, lambda name: within(name, "tests")) == []


MAX_MODULE_LINES = 600  # docs/layout.md: past that, a module is split by role


def test_no_module_but_test_code_is_over_600_lines():
    code = [path for path in python_files(ROOT) if not is_test_code(path, ROOT)]
    assert any(path.is_relative_to(ROOT / "operations") for path in code)
    long = {
        str(p.relative_to(ROOT)): n for p in code if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_the_tools_have_no_import_circle():
    files = [path for path in python_files(ROOT / "tools") if not is_test_code(path, ROOT)]
    assert any(path == ROOT / "tools" / "local" / "stack.py" for path in files)
    assert import_circle(files, ROOT) == []


def spelled_key_prefixes(path: Path) -> list[str]:
    """String literals of `path` holding a key prefix (docstrings, which only describe keys, aside)."""
    tree = ast.parse(path.read_text())
    prose = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in prose
        and any(prefix in node.value for prefix in KEY_PREFIXES)
    ]


def test_only_the_key_design_module_spells_key_prefixes():
    code = [
        *python_files(ROOT / "layers"),
        *python_files(ROOT / "functions"),
        *python_files(ROOT / "operations"),
    ]
    spelled = {
        str(path.relative_to(ROOT)): found
        for path in code
        if path != SHOP / "adapters" / "dynamodb" / "keys.py" and (found := spelled_key_prefixes(path))
    }
    assert spelled == {}
    assert spelled_key_prefixes(SHOP / "adapters" / "dynamodb" / "keys.py")  # where they are, it finds them


def store_name_comparisons(path: Path) -> list[str]:
    """Comparisons (==, !=) with a store's name as a literal: a branch on the store."""
    return [
        f"{path.name}:{node.lineno}"
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Compare)
        and any(isinstance(op, ast.Eq | ast.NotEq) for op in node.ops)
        and any(
            isinstance(side, ast.Constant) and side.value in STORE_NAMES
            for side in (node.left, *node.comparators)
        )
    ]


def test_operator_commands_do_not_branch_on_the_store():
    files = python_files(ROOT / "operations")
    assert len(files) >= 4
    assert [found for path in files for found in store_name_comparisons(path)] == []


# --- the checks themselves can fail ------------------------------------------------------------------------
@pytest.fixture
def package(tmp_path: Path) -> Path:
    for sub in ("domain", "adapters"):
        (tmp_path / "shop" / sub).mkdir(parents=True)
        (tmp_path / "shop" / sub / "__init__.py").write_text("")
    return tmp_path


@pytest.mark.parametrize(
    "statement",
    [
        "import boto3",
        "from botocore.exceptions import ClientError",
        "from aws_lambda_powertools import Logger",
        "from shop.adapters import keys",
        "from shop import runtime",
        "from ..runtime.config import Settings",
        "from . import missing\nfrom .. import adapters",
        "import pydantic",
        "if TYPE_CHECKING:\n    from mypy_boto3_dynamodb import DynamoDBClient",
        "def later():\n    import boto3",
    ],
)
def test_a_domain_module_importing_outside_the_domain_is_caught(package: Path, statement: str):
    module = package / "shop" / "domain" / "rules.py"
    module.write_text(f"from __future__ import annotations\nimport json\n{statement}\n")

    assert violations([module], package, domain_may_not_import) != []


def test_a_domain_module_importing_the_domain_and_the_standard_library_passes(package: Path):
    module = package / "shop" / "domain" / "rules.py"
    module.write_text(
        "import json\nfrom datetime import UTC\nfrom shop.domain.errors import X\nfrom . import y\n"
    )

    assert violations([module], package, domain_may_not_import) == []


@pytest.mark.parametrize(
    "statement",
    ["from shop.runtime.config import Settings", "from ..runtime import config", "import shop.runtime"],
)
def test_an_adapter_importing_the_runtime_is_caught(package: Path, statement: str):
    module = package / "shop" / "adapters" / "store.py"
    module.write_text(f"import boto3\nfrom shop.domain.orders import Order\n{statement}\n")

    assert violations([module], package, adapters_may_not_import) != []


# Each store's adapter: what a module of it may import, and the rule that catches the rest.
STORE_ADAPTERS = {
    "postgres": (
        "import psycopg\nfrom shop.adapters.postgres.connection import Database",
        postgres_adapter_may_not_import,
    ),
    "dynamodb": (
        "import boto3\nfrom shop.adapters import aws\nfrom shop.adapters.dynamodb import keys",
        dynamodb_adapter_may_not_import,
    ),
}


@pytest.mark.parametrize(
    ("store", "statement"),
    [
        ("postgres", "from shop.adapters.dynamodb.outbox_items import TraceHeader"),
        ("postgres", "from shop.adapters.dynamodb import keys"),
        ("postgres", "from shop.adapters import aws"),
        ("postgres", "from ..dynamodb.transactions import transact"),
        ("postgres", "def later():\n    import shop.adapters.dynamodb.order_repository"),
        ("dynamodb", "from shop.adapters.postgres.outbox import OutboxRow"),
        ("dynamodb", "from ..postgres import connection"),
        ("dynamodb", "def later():\n    import shop.adapters.postgres.order_repository"),
    ],
)
def test_a_store_adapter_importing_an_adapter_it_may_not_is_caught(package: Path, store: str, statement: str):
    allowed, may_not_import = STORE_ADAPTERS[store]
    (package / "shop" / "adapters" / store).mkdir()
    module = package / "shop" / "adapters" / store / "store.py"
    module.write_text(f"{allowed}\n{statement}\n")

    assert violations([module], package, may_not_import) != []


@pytest.mark.parametrize(
    ("source", "branches"),
    [
        ('if settings.order_store == "postgres":\n    pass\n', True),
        ('ok = "dynamodb" != store\n', True),
        ('ok = image.get("store") in ("postgres",)\n', False),
        ('print({"store": "postgres"})\n', False),
        ('"""Compares store == "postgres" in prose."""\n', False),
    ],
)
def test_a_comparison_with_a_store_name_is_found(tmp_path: Path, source: str, branches: bool):
    module = tmp_path / "commands.py"
    module.write_text(source)

    assert bool(store_name_comparisons(module)) is branches


@pytest.mark.parametrize(
    ("source", "holds_sql"),
    [
        ('"""Claims rows FOR UPDATE SKIP LOCKED (described, not run)."""\nX = "published"\n', False),
        ('def f(cursor):\n    """SELECT, in prose."""\n    return "UPDATEd"\n', False),
        ('QUERY = "SELECT 1"\n', True),
        ('def f(cursor, ms):\n    cursor.execute(f"SET LOCAL statement_timeout = {ms}")\n', True),
        ("def f(cursor, query):\n    cursor.execute(query)\n", True),
        ('DELETE = """\nDELETE FROM outbox WHERE position = %s\n"""\n', True),
    ],
)
def test_sql_in_a_module_is_found_and_prose_about_it_is_not(tmp_path: Path, source: str, holds_sql: bool):
    module = tmp_path / "relay.py"
    module.write_text(source)

    assert bool(sql_in(module)) is holds_sql


def product_test_module(root: Path, relative: str, statement: str) -> Path:
    """A module under root/tests that imports what product tests may, then `statement`."""
    module = root / relative
    module.parent.mkdir(parents=True, exist_ok=True)
    allowed = [
        "import tools",
        "import tests.conftest",
        "from tools.template import Template",
        "from tools.iam import decisions",
        "from tests.support import ROOT",
        "from tests.unit.fakes import F",
    ]
    module.write_text("\n".join([*allowed, statement, ""]))
    return module


def test_a_product_test_importing_the_template_reader_and_test_support_passes(tmp_path: Path):
    module = product_test_module(tmp_path, "tests/unit/test_x.py", "from tools.template.reader import ROOT")

    assert violations([module], tmp_path, product_tests_may_not_import) == []


@pytest.mark.parametrize(
    "statement",
    [
        "from tools.local.runtime.context import LambdaContext",
        "import tools.bench.write_cost",
        "from tools import docs",
        "from tools.chaos.harness import run",
        "from tests.local_stacks import start_stack",
        "from tests.integration.conftest import stop_stack",
        "def later():\n    from tools.local.stack import LocalStack",
        "if TYPE_CHECKING:\n    from tools.local.stack import LocalStack",
    ],
)
def test_a_product_test_importing_tooling_is_caught(tmp_path: Path, statement: str):
    module = product_test_module(tmp_path, "tests/unit/test_x.py", statement)

    assert violations([module], tmp_path, product_tests_may_not_import) != []


@pytest.mark.parametrize(
    "statement",
    [
        "def later():\n    from tools.local.stack import LocalStack",
        "if TYPE_CHECKING:\n    from tools.local.stack import LocalStack\nelse:\n    pass",
    ],
)
def test_a_conftest_may_import_tooling_when_a_fixture_runs_but_not_when_loaded(
    tmp_path: Path, statement: str
):
    module = product_test_module(tmp_path, "tests/conftest.py", statement)
    assert violations([module], tmp_path, product_tests_may_not_import, when_loaded=True) == []

    module.write_text(f"{module.read_text()}from tools.local.stack import StackOptions\n")
    assert violations([module], tmp_path, product_tests_may_not_import, when_loaded=True) == [
        "tests/conftest.py imports tools.local.stack",
        "tests/conftest.py imports tools.local.stack.StackOptions",
    ]


@pytest.mark.parametrize(
    ("relative", "counted"),
    [
        ("tools/local/services/order_database.py", True),
        ("operations/recovery.py", True),
        ("tools/local/tests/test_stack.py", False),
        ("tools/conftest.py", False),
        ("tests/unit/test_x.py", False),
    ],
)
def test_a_module_outside_the_tests_importing_them_is_caught(tmp_path: Path, relative: str, counted: bool):
    module = tmp_path / relative
    module.parent.mkdir(parents=True)
    module.write_text("def later():\n    from tests.support.postgres import connect\n")
    code = [module] if not is_test_code(module, tmp_path) else []

    assert bool(violations(code, tmp_path, lambda name: within(name, "tests"))) is counted


def test_an_import_circle_is_caught_through_a_type_checking_block(tmp_path: Path):
    (tmp_path / "local" / "inspector").mkdir(parents=True)
    stack = tmp_path / "local" / "stack.py"
    api = tmp_path / "local" / "inspector" / "api.py"
    stack.write_text("from local.inspector.api import inspector_for\n")
    api.write_text("from typing import Protocol\n")
    assert import_circle([stack, api], tmp_path) == []

    api.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from local.stack import LocalStack\n"
    )
    assert import_circle([stack, api], tmp_path) in (
        ["local.stack", "local.inspector.api", "local.stack"],
        ["local.inspector.api", "local.stack", "local.inspector.api"],
    )
