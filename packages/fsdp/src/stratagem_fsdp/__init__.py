"""stratagem-fsdp: ``Trainer(strategy="fsdp")`` on PyTorch's ``fully_shard``.

Importing this package is cheap: the names below load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stratagem_fsdp.checkpoint_io import DistributedCheckpointIO
    from stratagem_fsdp.strategy import FSDPStrategy

__all__ = ["DistributedCheckpointIO", "FSDPStrategy", "__version__"]

_LAZY = {
    "FSDPStrategy": "stratagem_fsdp.strategy",
    "DistributedCheckpointIO": "stratagem_fsdp.checkpoint_io",
}


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import version

        return version("stratagem-fsdp")
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'stratagem_fsdp' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
