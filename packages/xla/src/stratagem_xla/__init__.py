"""stratagem-xla: ``Trainer(strategy="single_xla" | "xla" | "xla_fsdp" | "xla_fsdp_v2")`` on torch_xla.

Importing this package is cheap and never imports torch_xla: the names below load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stratagem.exports import lazy_exports

if TYPE_CHECKING:
    from stratagem_xla.accelerator import XLAAccelerator
    from stratagem_xla.checkpoint_io import XLACheckpointIO
    from stratagem_xla.strategy import SingleXLAStrategy

__all__ = ["SingleXLAStrategy", "XLAAccelerator", "XLACheckpointIO", "__version__"]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "SingleXLAStrategy": "stratagem_xla.strategy",
        "XLAAccelerator": "stratagem_xla.accelerator",
        "XLACheckpointIO": "stratagem_xla.checkpoint_io",
    },
    "stratagem-xla",
)
