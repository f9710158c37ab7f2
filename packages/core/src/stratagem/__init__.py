"""stratagem: choose how PyTorch training is distributed, by name.

Importing this package is cheap: the public names below load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stratagem.connector import resolve
    from stratagem.module import Module
    from stratagem.trainer import Trainer

__all__ = ["Module", "Trainer", "__version__", "resolve"]

_LAZY = {
    "resolve": ("stratagem.connector", "resolve"),
    "Module": ("stratagem.module", "Module"),
    "Trainer": ("stratagem.trainer", "Trainer"),
}


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import version

        return version("stratagem")
    if name in _LAZY:
        module_name, attribute = _LAZY[name]
        value = getattr(importlib.import_module(module_name), attribute)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'stratagem' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
