"""The cold-start bench (tools/bench/cold_start.py): what it times, in which order, and the statistic."""

from __future__ import annotations

import ast
import os
from collections import Counter
from pathlib import Path

import pytest

from tools.bench import cold_start
from tools.bench.cold_start import Sample, Subject
from tools.template import ROOT, Template


def test_a_samples_ratio_is_the_whole_import_against_boto3_alone_by_cpu_time() -> None:
    sample = Sample(boto3_wall=0.5, boto3_cpu=0.2, rest_wall=0.3, rest_cpu=0.05)

    assert sample.ratio == pytest.approx(1.25)
    assert sample.wall_ratio == pytest.approx(1.6)


def test_every_subject_is_sampled_once_a_round_each_round_starting_one_further() -> None:
    order = cold_start.rounds(["a", "b", "c"], samples=4)

    assert Counter(order) == {"a": 4, "b": 4, "c": 4}
    each_round = [order[i : i + 3] for i in range(0, len(order), 3)]
    assert all(sorted(r) == ["a", "b", "c"] for r in each_round)
    assert [r[0] for r in each_round] == ["a", "b", "c", "a"]


@pytest.mark.parametrize(
    ("n", "low", "high"),
    [
        (15, 4, 12),  # P(Binomial(15, 1/2) <= 3) = 1.8%: a 96.5% interval
        (21, 6, 16),
        (7, 1, 7),  # P(<= 0) = 0.8%, P(<= 1) = 6.3%: min and max, a 98.4% interval
        (3, 1, 3),  # too few for 95%: min and max
    ],
)
def test_the_interval_of_the_median_is_made_of_order_statistics(n: int, low: int, high: int) -> None:
    values = [float(i) for i in range(n, 0, -1)]  # n .. 1: the k-th smallest is k

    assert cold_start.median_interval(values) == (low, high)


def test_a_subjects_figures_are_medians_of_its_samples_ratios_with_their_spread() -> None:
    samples = [Sample(1.0, 0.2, 0.5, 0.2 * r) for r in (0.10, 0.20, 0.21, 0.22, 0.90)]

    figures = cold_start.summarize(samples, "with_pyc")

    assert figures["ratio_to_boto3_with_pyc"] == pytest.approx(1.21)  # the outlier moves nothing
    assert figures["ratio_quartiles_with_pyc"] == pytest.approx([1.20, 1.22])
    assert figures["ratio_ci95_with_pyc"] == pytest.approx([1.10, 1.90])  # 5 samples: min and max
    assert figures["with_pyc_cpu_ms"] == pytest.approx(1000 * 0.2 * 1.21)
    assert figures["wall_ratio_to_boto3_with_pyc"] == pytest.approx(1.5)


def test_what_the_first_invocation_imports_is_timed_with_the_init() -> None:
    default = {"ORDER_STORE": "dynamodb"}
    postgres = {"ORDER_STORE": "postgres", "DATABASE_SECRET_ARN": "arn:secret"}

    assert cold_start.first_use_modules("OrdersApiFunction", default) == ()
    assert cold_start.first_use_modules("OrdersApiFunction", postgres) == (
        *cold_start.POSTGRES_ADAPTER,
        *cold_start.SECRET,
    )
    assert cold_start.first_use_modules("OutboxPublisherFunction", postgres) == cold_start.SECRET
    # Locally (no secret) the password is not fetched.
    assert cold_start.first_use_modules("OutboxPublisherFunction", {"ORDER_STORE": "postgres"}) == ()
    crt = {**postgres, "PUBLISH_TRANSPORT": "crt"}
    assert cold_start.first_use_modules("OutboxPublisherFunction", crt) == (
        *cold_start.SECRET,
        *cold_start.CRT_TRANSPORT,
    )


def test_awscrt_shipped_by_a_function_is_charged_to_it_not_to_import_boto3(tmp_path: Path) -> None:
    # botocore imports awscrt whenever it can (botocore/compat.py): a function that ships it must not
    # make its `import boto3` heavier and its ratio lower.
    code = tmp_path / "function"
    (code / "boto3").mkdir(parents=True)
    (code / "boto3" / "__init__.py").write_text("try:\n    import awscrt\nexcept ImportError:\n    pass\n")
    (code / "awscrt").mkdir()
    burn = "import time\nend = time.process_time() + 0.2\nwhile time.process_time() < end:\n    pass\n"
    (code / "awscrt" / "__init__.py").write_text(burn)
    (code / "app.py").write_text("import awscrt\n")
    subject = cold_start.Subject([str(code)], ("app",), {"PATH": os.environ.get("PATH", "")})

    timed = cold_start.sample(subject, write_bytecode=False)

    assert timed.boto3_cpu < 0.1 <= 0.2 <= timed.rest_cpu + 0.01


def test_each_variant_has_its_target() -> None:
    assert cold_start.target("InventoryFunction") == 1.2
    assert cold_start.target(f"OutboxPublisherFunction{cold_start.POSTGRES_LABEL}") == 1.3


def _deferred_imports(path: Path) -> set[str]:
    """Modules (or module.name for `from module import name`) imported inside a function body."""
    found: set[str] = set()
    for function in ast.walk(ast.parse(path.read_text())):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_every_import_deferred_to_a_function_body_is_timed_or_never_on_a_first_invocation() -> None:
    # A module imported on first use is still paid before the first request is served: moving an
    # import into a function must not pass for a cut. Each one is either timed with the init
    # (FIRST_USE) or never runs on a deployed function's first invocation (with the reason).
    timed = {*cold_start.POSTGRES_ADAPTER, *cold_start.SECRET, *cold_start.CRT_TRANSPORT}
    sources = [*(ROOT / "layers" / "shared" / "shop").rglob("*.py"), *(ROOT / "functions").glob("*/*.py")]
    unaccounted = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in sources
        for name in _deferred_imports(path)
        if name not in cold_start.NOT_ON_FIRST_INVOCATION
        and name not in timed
        and name.rpartition(".")[0] not in timed
    }

    assert not unaccounted


def test_the_variants_are_the_default_stores_functions_and_the_postgres_ones_that_differ(
    tmp_path: Path,
) -> None:
    build = tmp_path / "build"
    (build / "SharedLayer" / "python" / "__pycache__").mkdir(parents=True)
    (build / "SharedLayer" / "python" / "__pycache__" / "x.cpython-313.pyc").write_bytes(b"")
    for logical_id in Template.load(parameters={"OrderStore": "postgres"}).functions():
        (build / logical_id / "__pycache__").mkdir(parents=True)
        (build / logical_id / "__pycache__" / "app.cpython-313.pyc").write_bytes(b"")

    subjects, sizes = cold_start.subjects_of(build, tmp_path / "work")

    default = [name for name in subjects if not name.endswith(cold_start.POSTGRES_LABEL)]
    assert set(default) == {n for n in Template.load().functions() if Template.load().is_created(n)}
    api = subjects[f"OrdersApiFunction{cold_start.POSTGRES_LABEL}"]
    assert api.env["ORDER_STORE"] == "postgres"
    assert api.modules == ("app", *cold_start.POSTGRES_ADAPTER, *cold_start.SECRET)
    assert subjects["OrdersApiFunction"].modules == ("app",)
    assert f"InventoryFunction{cold_start.POSTGRES_LABEL}" not in subjects  # the same code path
    # "as shipped": the layer's bytecode (layers/shared/Makefile compiles it), none of the functions' (sam
    # build ships their code as source), every file dated as Lambda extracts a zip
    work = tmp_path / "work"
    bytecode = [p.relative_to(work).as_posix() for p in work.rglob("*.pyc")]
    assert bytecode == ["layer/__pycache__/x.cpython-313.pyc"]
    assert {p.stat().st_mtime for p in work.rglob("*")} == {cold_start.ZIP_EPOCH}
    assert set(sizes) == set(subjects)


def test_a_run_times_boto3_then_the_subject_in_fresh_interpreters(tmp_path: Path) -> None:
    layer = tmp_path / "layer"
    (layer / "boto3").mkdir(parents=True)
    (layer / "boto3" / "__init__.py").write_text("total = sum(range(200_000))\n")
    code = tmp_path / "function"
    code.mkdir()
    (code / "app.py").write_text("import boto3\ntotal = sum(range(100_000))\n")
    (code / "later.py").write_text("import sys\nassert 'app' in sys.modules\n")
    env = {"PATH": os.environ.get("PATH", "")}
    subjects = {"F": Subject([str(code), str(layer)], ("app", "later"), env)}

    timings = cold_start.measure(subjects, samples=3, write_bytecode=False)

    assert len(timings["F"]) == 3
    assert all(s.boto3_cpu > 0 and s.rest_cpu > 0 for s in timings["F"])
    assert not list(tmp_path.rglob("*.pyc"))  # -B: no bytecode written


def test_a_figure_is_settled_when_its_interval_is_clear_of_the_target() -> None:
    assert cold_start.settled((1.10, 1.20), 1.2)
    assert cold_start.settled((1.21, 1.40), 1.2)
    assert not cold_start.settled((1.19, 1.21), 1.2)


def test_a_target_is_met_by_the_whole_interval_not_by_the_median_alone() -> None:
    assert cold_start.meets((1.10, 1.20), 1.2)
    # A median of 1.199 whose interval reaches 1.21 is within the measurement's precision of 1.2: not
    # met, so that the next run, measuring 1.201, says the same.
    assert not cold_start.meets((1.19, 1.21), 1.2)


def test_only_the_subjects_not_settled_get_more_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    # Far from its target, "clear" settles in the first rounds; "close" straddles its target at every
    # count, so it is sampled until max_samples.
    spread = {"clear": [0.50, 0.52, 0.54], "close": [0.10, 0.20, 0.30]}
    drawn: Counter[str] = Counter()

    def fake_sample(subject: Subject, write_bytecode: bool) -> Sample:
        name = subject.modules[0]
        rest = spread[name][drawn[name] % 3]
        drawn[name] += 1
        return Sample(1.0, 1.0, 1.0, rest)

    monkeypatch.setattr(cold_start, "sample", fake_sample)
    subjects = {name: Subject([], (name,), {}) for name in spread}

    timings = cold_start.measure(subjects, 6, True, targets={"clear": 1.3, "close": 1.2}, max_samples=12)

    assert len(timings["clear"]) == 6
    assert len(timings["close"]) == 12
