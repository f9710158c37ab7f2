"""stratagem-ipu: ``Trainer(strategy="ipu_strategy", accelerator="ipu")`` on Graphcore's PopTorch.

Importing this package is cheap and imports no PopTorch: the names below load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stratagem_ipu.accelerator import IPUAccelerator
    from stratagem_ipu.precision import IPUMixedPrecision
    from stratagem_ipu.strategy import IPUStrategy

__all__ = ["IPUAccelerator", "IPUMixedPrecision", "IPUStrategy", "__version__"]

_LAZY = {
    "IPUAccelerator": "stratagem_ipu.accelerator",
    "IPUMixedPrecision": "stratagem_ipu.precision",
    "IPUStrategy": "stratagem_ipu.strategy",
}


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import version

        return version("stratagem-ipu")
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'stratagem_ipu' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
