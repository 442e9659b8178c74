"""A package's names imported on first use (PEP 562 module `__getattr__`): the package's own import then loads none of
the modules that define them. models/ and hybrid.cp use it so the planner reads their torch-free modules (configs,
enums, byte formulas) without loading the runtime (docs/architecture.md, "The planner runs without the runtime")."""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_names(package: str, names: dict[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """The `__getattr__` of `package`: a name of `names` (name -> the module defining it) is imported at its first
    use and cached in the package's `namespace` (its globals), so later uses are plain lookups."""
    def __getattr__(name: str) -> Any:
        if name in names:
            value = getattr(importlib.import_module(names[name]), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return __getattr__
