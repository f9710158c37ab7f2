"""stratagem-colossalai: ``Trainer(strategy="colossalai")``, Colossal-AI's Booster with a plugin of your choice.

Importing this package is cheap: the strategy (and torch, and colossalai) load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stratagem.exports import lazy_exports

if TYPE_CHECKING:
    from stratagem_colossalai.options import LIGHTNING_GEMINI_OPTIONS, PLUGINS
    from stratagem_colossalai.strategy import ColossalAIStrategy

__all__ = ["ColossalAIStrategy", "LIGHTNING_GEMINI_OPTIONS", "PLUGINS", "__version__"]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "LIGHTNING_GEMINI_OPTIONS": "stratagem_colossalai.options",
        "PLUGINS": "stratagem_colossalai.options",
        "ColossalAIStrategy": "stratagem_colossalai.strategy",
    },
    "stratagem-colossalai",
)
