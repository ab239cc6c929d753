"""Build the SAM artefacts for this machine's architecture.

The deployable build is arm64; its native wheels (pydantic-core) cannot be imported on an x86_64
machine. Tests and benchmarks that import or time the built artefacts build the same template for
the host architecture instead: same code, same dependencies, loadable here.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

from tools.template import ROOT

SAM = Path(sys.executable).parent / "sam"
_HOST_ARCH = {"x86_64": "x86_64", "AMD64": "x86_64", "aarch64": "arm64", "arm64": "arm64"}[platform.machine()]


def build_for_host(workdir: Path) -> Path:
    """sam build of template.yaml for the host architecture into workdir/build; returns that dir."""
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    text = (ROOT / "template.yaml").read_text()
    twin = workdir / "template.yaml"
    twin.write_text(
        text.replace("Architectures: [arm64]", f"Architectures: [{_HOST_ARCH}]")
        .replace("BuildArchitecture: arm64", f"BuildArchitecture: {_HOST_ARCH}")
        .replace("CompatibleArchitectures: [arm64]", f"CompatibleArchitectures: [{_HOST_ARCH}]")
        .replace("CodeUri: functions/", f"CodeUri: {ROOT}/functions/")
        .replace("ContentUri: layers/", f"ContentUri: {ROOT}/layers/")
        .replace("Location: nested/", f"Location: {ROOT}/nested/")
    )
    build_dir = workdir / "build"
    # sam finds the python3.13 it builds with on PATH: the venv's.
    env = {**os.environ, "SAM_CLI_TELEMETRY": "0", "PATH": f"{SAM.parent}{os.pathsep}{os.environ['PATH']}"}
    # The shared layer's Makefile picks its wheels for this architecture (BuildArchitecture is not passed).
    env["LAMBDA_ARCHITECTURE"] = _HOST_ARCH
    # The copy is built outside the repository, away from samconfig.toml: ask for the Fn::ForEach
    # expansion (AWS::LanguageExtensions) explicitly.
    command = [str(SAM), "build", "--template", str(twin), "--build-dir", str(build_dir), "--parallel"]
    built = subprocess.run(
        [*command, "--language-extensions"],
        check=False,
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if built.returncode != 0:
        raise RuntimeError(f"sam build for {_HOST_ARCH} failed:\n{(built.stdout + built.stderr)[-3000:]}")
    return build_dir
