"""The artefacts `sam build` makes, checked against what the python3.13 arm64 runtime loads: README.md.

`python -m tools.artefacts [.aws-sam/build]` prints each problem and exits 1, or prints a one-line
summary and exits 0. Imports: the standard library, `packaging` and `tools.template` (the build's
template is read through it).
"""

from tools.artefacts.check import (
    LAMBDA_UNZIPPED_LIMIT,
    check_build,
    elf_problem,
    extension_problem,
    platform_problem,
    wheel_problems,
)

__all__ = [
    "LAMBDA_UNZIPPED_LIMIT",
    "check_build",
    "elf_problem",
    "extension_problem",
    "platform_problem",
    "wheel_problems",
]
