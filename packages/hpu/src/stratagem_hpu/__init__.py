"""stratagem-hpu: Intel Gaudi (HPU) strategies, accelerator and fp8 precision for stratagem.

Importing this package is cheap: nothing of Habana's is imported, and no card is probed, until a run uses it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stratagem_hpu.accelerator import HPUAccelerator
    from stratagem_hpu.availability import habana_problem
    from stratagem_hpu.checkpoint_io import HPUCheckpointIO
    from stratagem_hpu.precision import HPUFP8Precision
    from stratagem_hpu.strategy import HPUParallelStrategy, HPUSingleStrategy, HPUStrategy

__all__ = [
    "HPUAccelerator",
    "HPUCheckpointIO",
    "HPUFP8Precision",
    "HPUParallelStrategy",
    "HPUSingleStrategy",
    "HPUStrategy",
    "habana_problem",
]

_LAZY = {
    "HPUAccelerator": "stratagem_hpu.accelerator",
    "HPUCheckpointIO": "stratagem_hpu.checkpoint_io",
    "HPUFP8Precision": "stratagem_hpu.precision",
    "HPUParallelStrategy": "stratagem_hpu.strategy",
    "HPUSingleStrategy": "stratagem_hpu.strategy",
    "HPUStrategy": "stratagem_hpu.strategy",
    "habana_problem": "stratagem_hpu.availability",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'stratagem_hpu' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
