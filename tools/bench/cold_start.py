"""Cold start: import time of each built function, as Lambda runs it, against `import boto3` alone.

Each sample is a fresh interpreter (-I -S: no site-packages, only the artefact and its layer on the
path) that times `import app`. "no .pyc" is how Lambda runs a `sam build` artefact (the build has no
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
    for logical_id, spec in template.functions().items():
        code = workdir / logical_id
        shutil.copytree(host_build / logical_id, code)
        subjects[logical_id] = ([str(code), str(layer)], "app", {**base_env, **spec.environment})
        sizes[logical_id] = _size(code) + _size(layer)

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
