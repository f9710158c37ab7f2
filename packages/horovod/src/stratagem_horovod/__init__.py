"""stratagem-horovod: ``Trainer(strategy="horovod")``, gradients averaged by horovod's DistributedOptimizer.

Importing this package is cheap: the strategy (and torch, and horovod) load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stratagem_horovod.environment import HorovodrunEnvironment
    from stratagem_horovod.options import COMPRESSIONS
    from stratagem_horovod.strategy import HorovodStrategy

__all__ = ["COMPRESSIONS", "HorovodStrategy", "HorovodrunEnvironment"]

_LAZY = {
    "COMPRESSIONS": "stratagem_horovod.options",
    "HorovodStrategy": "stratagem_horovod.strategy",
    "HorovodrunEnvironment": "stratagem_horovod.environment",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'stratagem_horovod' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
