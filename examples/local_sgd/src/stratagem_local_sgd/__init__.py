"""Local SGD for stratagem, as an example of a third-party ``ParallelStrategy`` plugin.

Importing the package is free: stratagem imports ``stratagem_local_sgd.registration`` while
listing strategies, which imports this ``__init__`` first, so the strategy (and torch) load
only when ``strategy="local_sgd"`` is chosen.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stratagem_local_sgd.strategy import LocalSGDStrategy

__all__ = ["LocalSGDStrategy"]


def __getattr__(name: str) -> Any:
    if name == "LocalSGDStrategy":
        from stratagem_local_sgd.strategy import LocalSGDStrategy

        return LocalSGDStrategy
    raise AttributeError(f"module 'stratagem_local_sgd' has no attribute {name!r}")
