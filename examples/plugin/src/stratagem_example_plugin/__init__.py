"""An example stratagem plugin. Users never import it: stratagem finds it through its entry point.

Importing the package is free: stratagem imports ``stratagem_example_plugin.registration``
while listing strategies, which imports this ``__init__`` first, so the strategy (and torch)
load only when ``StepCountingStrategy`` is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stratagem.exports import lazy_exports

if TYPE_CHECKING:
    from stratagem_example_plugin.strategy import StepCountingStrategy

__all__ = ["StepCountingStrategy", "__version__"]

__getattr__, __dir__ = lazy_exports(
    __name__, {"StepCountingStrategy": "stratagem_example_plugin.strategy"}, "stratagem-example-plugin"
)
