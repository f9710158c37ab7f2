"""stratagem-colossalai: ``Trainer(strategy="colossalai")``, Colossal-AI's Booster with a plugin of your choice.

Importing this package is cheap: the strategy (and torch, and colossalai) load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stratagem_colossalai.options import LIGHTNING_GEMINI_OPTIONS, PLUGINS
    from stratagem_colossalai.strategy import ColossalAIStrategy

__all__ = ["LIGHTNING_GEMINI_OPTIONS", "PLUGINS", "ColossalAIStrategy"]

_LAZY = {
    "LIGHTNING_GEMINI_OPTIONS": "stratagem_colossalai.options",
    "PLUGINS": "stratagem_colossalai.options",
    "ColossalAIStrategy": "stratagem_colossalai.strategy",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'stratagem_colossalai' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
