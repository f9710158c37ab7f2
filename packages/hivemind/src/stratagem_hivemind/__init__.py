"""stratagem-hivemind: collaborative training over a hivemind swarm, as a stratagem strategy.

Importing this package is cheap and never imports hivemind: the names below load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stratagem_hivemind.options import SwarmOptions
    from stratagem_hivemind.strategy import HivemindStrategy

__all__ = ["HivemindStrategy", "SwarmOptions", "__version__"]

_LAZY = {
    "HivemindStrategy": ("stratagem_hivemind.strategy", "HivemindStrategy"),
    "SwarmOptions": ("stratagem_hivemind.options", "SwarmOptions"),
}


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import version

        return version("stratagem-hivemind")
    if name in _LAZY:
        module_name, attribute = _LAZY[name]
        value = getattr(importlib.import_module(module_name), attribute)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'stratagem_hivemind' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
