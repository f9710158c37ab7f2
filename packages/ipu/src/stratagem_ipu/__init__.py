"""stratagem-ipu: ``Trainer(strategy="ipu_strategy", accelerator="ipu")`` on Graphcore's PopTorch.

Importing this package is cheap and imports no PopTorch: the names below load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stratagem.exports import lazy_exports

if TYPE_CHECKING:
    from stratagem_ipu.accelerator import IPUAccelerator
    from stratagem_ipu.precision import IPUMixedPrecision
    from stratagem_ipu.strategy import IPUStrategy

__all__ = ["IPUAccelerator", "IPUMixedPrecision", "IPUStrategy", "__version__"]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "IPUAccelerator": "stratagem_ipu.accelerator",
        "IPUMixedPrecision": "stratagem_ipu.precision",
        "IPUStrategy": "stratagem_ipu.strategy",
    },
    "stratagem-ipu",
)
