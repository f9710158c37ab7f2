"""Package namespaces whose public names load on first use, so that importing a package costs next to nothing."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str], distribution: str
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of ``package`` (pass ``__name__``).

    Each name in ``exports`` is imported from the module it maps to when first used, then kept in
    the package's namespace; ``__version__`` is the installed version of ``distribution``. Use::

        __getattr__, __dir__ = lazy_exports(__name__, {"MyStrategy": "my_package.strategy"}, "my-package")

    with the same names imported under ``TYPE_CHECKING`` for type checkers.
    """
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        if name == "__version__":
            from importlib.metadata import version

            return version(distribution)
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports, "__version__"})

    return __getattr__, __dir__
