"""The strategy layer without the Trainer: :class:`Runtime` for a user's own loop, and the lifecycle both share."""

from __future__ import annotations

from typing import TYPE_CHECKING

from stratagem.exports import lazy_exports

if TYPE_CHECKING:
    from stratagem.runtime.lifecycle import StrategyLifecycle
    from stratagem.runtime.runtime import Runtime
    from stratagem.runtime.wrappers import RuntimeDataLoader, RuntimeModule, RuntimeOptimizer

__all__ = ["Runtime", "RuntimeDataLoader", "RuntimeModule", "RuntimeOptimizer", "StrategyLifecycle"]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Runtime": "stratagem.runtime.runtime",
        "RuntimeDataLoader": "stratagem.runtime.wrappers",
        "RuntimeModule": "stratagem.runtime.wrappers",
        "RuntimeOptimizer": "stratagem.runtime.wrappers",
        "StrategyLifecycle": "stratagem.runtime.lifecycle",
    },
    "stratagem",
)
