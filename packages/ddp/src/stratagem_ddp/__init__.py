"""stratagem-ddp: distributed data parallel strategies for stratagem.

Importing this package is cheap: the strategies (and torch) load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stratagem_ddp.dp import DataParallelStrategy
    from stratagem_ddp.registration import register
    from stratagem_ddp.strategy import DDPStrategy

__all__ = ["DDPStrategy", "DataParallelStrategy", "register"]

_LAZY = {
    "DDPStrategy": "stratagem_ddp.strategy",
    "DataParallelStrategy": "stratagem_ddp.dp",
    "register": "stratagem_ddp.registration",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'stratagem_ddp' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
