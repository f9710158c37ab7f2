"""An example stratagem plugin. Users never import it: stratagem finds it through its entry point.

Importing the package is free: stratagem imports ``stratagem_example_plugin.registration``
while listing strategies, which imports this ``__init__`` first, so the strategy (and torch)
load only when ``StepCountingStrategy`` is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stratagem_example_plugin.strategy import StepCountingStrategy

__all__ = ["StepCountingStrategy"]


def __getattr__(name: str) -> Any:
    if name == "StepCountingStrategy":
        from stratagem_example_plugin.strategy import StepCountingStrategy

        return StepCountingStrategy
    raise AttributeError(f"module 'stratagem_example_plugin' has no attribute {name!r}")
