"""Cold start: import time of each built function, as Lambda runs it, against `import boto3` alone.

Each sample is a fresh interpreter (-I -S: no site-packages, only the artefact and its layer on the
path) that times `import app` (with OrderStore=postgres, the order service's functions also import
the adapter they load on first use). "no .pyc" is how Lambda runs a `sam build` artefact (the build has no
bytecode); "with .pyc" is after compileall. Samples are interleaved across subjects and the median
is reported, so the shared machine's noise hits every subject alike.
"""

from __future__ import annotations

import compileall
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from tools.template import Template

_TIMER = (
    "import sys, time\n"
    "sys.path[:0] = {paths!r}\n"
    "start, start_cpu = time.perf_counter(), time.process_time()\n"
    "import {module}\n"
    "print(time.perf_counter() - start, time.process_time() - start_cpu)\n"
)


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _sample(paths: list[str], module: str, env: dict[str, str], write_bytecode: bool) -> tuple[float, float]:
    """Wall and CPU seconds of one import in a fresh interpreter."""
    flags = ["-I", "-S"] + ([] if write_bytecode else ["-B"])
    result = subprocess.run(
        [sys.executable, *flags, "-c", _TIMER.format(paths=paths, module=module)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    wall, cpu = result.stdout.strip().splitlines()[-1].split()
    return float(wall), float(cpu)


POSTGRES_LABEL = " [postgres]"
KEEPS_ORDERS = ("OrdersApiFunction", "OrderStatusFunction")  # shop/runtime/wiring/orders.py
POSTGRES_ADAPTER = "shop.adapters.postgres.order_repository, shop.runtime.wiring.order_database"


def run(host_build: Path, workdir: Path, samples: int) -> dict[str, Any]:
    template = Template.load()
    layer = workdir / "layer"
    shutil.rmtree(workdir, ignore_errors=True)
    shutil.copytree(host_build / "SharedLayer" / "python", layer)
    subjects: dict[str, tuple[list[str], str, dict[str, str]]] = {}
    base_env = {
        "PATH": os.environ.get("PATH", ""),
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_LAMBDA_FUNCTION_NAME": "bench",
    }
    subjects["import boto3"] = ([str(layer)], "boto3", base_env)
    sizes: dict[str, int] = {}
    # Every function of the default store (OrderStore=dynamodb) with its environment, then, labelled
    # POSTGRES_LABEL, each function that runs another code path with OrderStore=postgres: the ones
    # only that store has, and those that keep orders there (shop/runtime/wiring/orders.py).
    postgres = Template.load(parameters={"OrderStore": "postgres"})
    variants = [
        (logical_id, logical_id, template)
        for logical_id in template.functions()
        if template.is_created(logical_id)
    ]
    variants += [
        (f"{logical_id}{POSTGRES_LABEL}", logical_id, postgres)
        for logical_id in postgres.functions()
        if not template.is_created(logical_id) or logical_id in KEEPS_ORDERS
    ]
    for name, logical_id, source in variants:
        code = workdir / logical_id
        if not code.exists():
            shutil.copytree(host_build / logical_id, code)
        environment = source.function(logical_id).environment
        # The order service loads its PostgreSQL adapter on first use (not at import): its first
        # invocation pays for it, so it is timed with the import here.
        module = "app" if name == logical_id or logical_id not in KEEPS_ORDERS else f"app, {POSTGRES_ADAPTER}"
        subjects[name] = ([str(code), str(layer)], module, {**base_env, **environment})
        sizes[name] = _size(code) + _size(layer)

    results: dict[str, dict[str, float]] = {}
    for bytecode in (False, True):
        label = "with_pyc" if bytecode else "no_pyc"
        if bytecode:
            compileall.compile_dir(str(workdir), quiet=1)
        timings: dict[str, list[tuple[float, float]]] = {name: [] for name in subjects}
        for _ in range(samples):
            for name, (paths, module, env) in subjects.items():
                timings[name].append(_sample(paths, module, env, write_bytecode=bytecode))
        for name, values in timings.items():
            figures = results.setdefault(name, {})
            figures[f"{label}_ms"] = 1000 * statistics.median(wall for wall, _ in values)
            figures[f"{label}_cpu_ms"] = 1000 * statistics.median(cpu for _, cpu in values)
    boto3_pyc = results["import boto3"]["with_pyc_ms"]
    boto3_no_pyc = results["import boto3"]["no_pyc_ms"]
    boto3_pyc_cpu = results["import boto3"]["with_pyc_cpu_ms"]
    for name, figures in results.items():
        figures["ratio_to_boto3_with_pyc"] = figures["with_pyc_ms"] / boto3_pyc
        figures["ratio_to_boto3_no_pyc"] = figures["no_pyc_ms"] / boto3_no_pyc
        # CPU time is what the import itself costs, whatever else the machine is running.
        figures["cpu_ratio_to_boto3_with_pyc"] = figures["with_pyc_cpu_ms"] / boto3_pyc_cpu
        if name in sizes:
            figures["artefact_bytes"] = sizes[name]
    return {"samples": samples, "subjects": results}
