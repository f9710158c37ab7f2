"""stratagem-hpu: Intel Gaudi (HPU) strategies, accelerator and fp8 precision for stratagem.

Importing this package is cheap: nothing of Habana's is imported, and no card is probed, until a run uses it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stratagem.exports import lazy_exports

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
    "__version__",
    "habana_problem",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "HPUAccelerator": "stratagem_hpu.accelerator",
        "HPUCheckpointIO": "stratagem_hpu.checkpoint_io",
        "HPUFP8Precision": "stratagem_hpu.precision",
        "HPUParallelStrategy": "stratagem_hpu.strategy",
        "HPUSingleStrategy": "stratagem_hpu.strategy",
        "HPUStrategy": "stratagem_hpu.strategy",
        "habana_problem": "stratagem_hpu.availability",
    },
    "stratagem-hpu",
)
