"""Local SGD for stratagem, as an example of a third-party ``ParallelStrategy`` plugin.

Importing the package is free: stratagem imports ``stratagem_local_sgd.registration`` while
listing strategies, which imports this ``__init__`` first, so the strategy (and torch) load
only when ``strategy="local_sgd"`` is chosen.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stratagem.exports import lazy_exports

if TYPE_CHECKING:
    from stratagem_local_sgd.strategy import LocalSGDStrategy

__all__ = ["LocalSGDStrategy", "__version__"]

__getattr__, __dir__ = lazy_exports(
    __name__, {"LocalSGDStrategy": "stratagem_local_sgd.strategy"}, "stratagem-local-sgd"
)
