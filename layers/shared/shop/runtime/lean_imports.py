"""Load only the Powertools modules a function uses, not every sibling their package `__init__` imports.

Importing `aws_lambda_powertools.event_handler.api_gateway` runs `event_handler/__init__.py` first, which
imports every resolver (AppSync and with it `asyncio`, Bedrock, VPC Lattice, ...); importing
`utilities.data_classes.sqs_event` (as the batch utility does) runs `data_classes/__init__.py`, which
imports every event class Powertools has. Those two `__init__`s made up 30-40 ms of the API's cold
start and 8 ms of each consumer's (docs/performance.md, "Cold start"); `event_handler.openapi`'s, which the
resolver's modules go through, another 0.5-1.

`defer_package_init` registers such a package without running its `__init__`: its submodules import
as usual, and a name the `__init__` re-exports is imported from its own submodule when first used, so
`from aws_lambda_powertools.event_handler import Response` still works and gives the same object. Only
packages whose `__init__` does nothing but re-export (imports, `__all__`, docstring) are deferred; any
other package, or one already imported, is left alone.

`asyncio` (5-8 ms) is imported by the batch utility's module for its async processor only; the
consumers use the synchronous one. `load_on_first_use` puts a stand-in in `sys.modules` that imports
the real module the first time one of its attributes is used, so a function that never touches it
never pays for it, and one that does gets the real module. (The standard library's `LazyLoader` does
not serve: every later `import asyncio` statement reads the module's `__spec__`, which loads it.) Logging
would use it on the first log line, when every log record asks asyncio for its task's name: with the
stand-in in place, records do not (`logging.logAsyncioTasks`; the functions run no asyncio tasks).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import logging
import sys
import types
from pathlib import Path
from typing import Any

# The packages a function's import path goes through, whose __init__s only re-export; a parent before its
# subpackage (deferring a subpackage imports its parent, and that would run the parent's __init__).
POWERTOOLS_PACKAGES = (
    "aws_lambda_powertools.event_handler",
    "aws_lambda_powertools.utilities.data_classes",
    # The resolver imports openapi's config, types and exceptions; the package's __init__ adds the OpenAPI
    # schema merger (and with it ast and fnmatch work), which only a function serving Swagger runs.
    "aws_lambda_powertools.event_handler.openapi",
)


def reexports(init_source: str, package: str) -> dict[str, tuple[str, str]] | None:
    """{name: (module, name in module)} of a re-export-only `__init__`; None if it does anything else."""
    names: dict[str, tuple[str, str]] = {}
    for node in ast.parse(init_source).body:
        if isinstance(node, ast.ImportFrom):
            relative = "." * node.level + (node.module or "")
            source = importlib.util.resolve_name(relative, package) if node.level else node.module
            if source is None or any(alias.name == "*" for alias in node.names):
                return None
            for alias in node.names:
                names[alias.asname or alias.name] = (source, alias.name)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        elif isinstance(node, ast.Assign) and all(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            continue
        else:
            return None
    return names


class _DeferredPackage(types.ModuleType):
    """A package whose re-exported names are imported on first access."""

    _reexports: dict[str, tuple[str, str]]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            source, original = self._reexports[name]
        except KeyError:
            # Not a re-export: a submodule (`from package import submodule`) or a missing name.
            if importlib.util.find_spec(f"{self.__name__}.{name}") is None:
                raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}") from None
            return importlib.import_module(f"{self.__name__}.{name}")
        value = getattr(importlib.import_module(source), original)
        object.__setattr__(self, name, value)
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        # Importing a submodule binds it on its package. Where the __init__ re-exports a same-named
        # object from it (data_classes.event_source, the decorator), the object wins, as it does there.
        reexported = self.__dict__.get("_reexports", {}).get(name)
        if isinstance(value, types.ModuleType) and reexported is not None and reexported[0] == value.__name__:
            value = getattr(value, reexported[1])
        object.__setattr__(self, name, value)


def defer_package_init(name: str) -> bool:
    """Register package `name` without running its `__init__`; False if it was not deferred."""
    if name in sys.modules:
        return False
    parent_name, _, child = name.rpartition(".")
    parent = importlib.import_module(parent_name)
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None or not spec.submodule_search_locations:
        return False
    names = reexports(Path(spec.origin).read_text(), name)
    if names is None:
        return False
    package = _DeferredPackage(name)
    object.__setattr__(package, "_reexports", names)
    package.__spec__ = spec
    package.__loader__ = spec.loader
    package.__file__ = spec.origin
    package.__path__ = list(spec.submodule_search_locations)
    package.__package__ = name
    sys.modules[name] = package
    setattr(parent, child, package)
    return True


# Modules imported on a function's path but used only by code the functions do not run.
LOADED_ON_FIRST_USE = ("asyncio",)


class _LoadedOnFirstUse(types.ModuleType):
    """Stands in `sys.modules` for a module until one of its attributes is used, then imports it."""

    def __getattr__(self, name: str) -> Any:
        real = self.__dict__.get("_real")
        if real is None:
            if sys.modules.get(self.__name__) is self:
                del sys.modules[self.__name__]
            real = importlib.import_module(self.__name__)
            object.__setattr__(self, "_real", real)
        return getattr(real, name)


def load_on_first_use(name: str) -> bool:
    """Register module `name` to be imported on its first attribute access; False if already imported."""
    if name in sys.modules:
        return False
    spec = importlib.util.find_spec(name)
    if spec is None:
        return False
    stand_in = _LoadedOnFirstUse(name)
    stand_in.__spec__ = spec  # read by every `import name`; found here, it does not load the module
    sys.modules[name] = stand_in
    return True


def defer_powertools_package_inits() -> None:
    for name in POWERTOOLS_PACKAGES:
        defer_package_init(name)
    for name in LOADED_ON_FIRST_USE:
        load_on_first_use(name)
    if isinstance(sys.modules.get("asyncio"), _LoadedOnFirstUse):
        # A LogRecord reads asyncio.current_task() whenever asyncio is in sys.modules: the stand-in would be
        # loaded by the first log line of each execution environment (25-40 ms of CPU), not saved.
        logging.logAsyncioTasks = False  # type: ignore[attr-defined]  # (3.12+, not in typeshed)
