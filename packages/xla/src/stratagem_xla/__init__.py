"""stratagem-xla: ``Trainer(strategy="single_xla" | "xla" | "xla_fsdp" | "xla_fsdp_v2")`` on torch_xla.

Importing this package is cheap and never imports torch_xla: the names below load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stratagem_xla.accelerator import XLAAccelerator
    from stratagem_xla.checkpoint_io import XLACheckpointIO
    from stratagem_xla.strategy import SingleXLAStrategy

__all__ = ["SingleXLAStrategy", "XLAAccelerator", "XLACheckpointIO", "__version__"]

_LAZY = {
    "SingleXLAStrategy": "stratagem_xla.strategy",
    "XLAAccelerator": "stratagem_xla.accelerator",
    "XLACheckpointIO": "stratagem_xla.checkpoint_io",
}


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import version

        return version("stratagem-xla")
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'stratagem_xla' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
