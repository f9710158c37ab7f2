"""stratagem-ddp: distributed data parallel strategies for stratagem.

Importing this package is cheap: the strategies (and torch) load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stratagem.exports import lazy_exports

if TYPE_CHECKING:
    from stratagem_ddp.dp import DataParallelStrategy
    from stratagem_ddp.registration import register
    from stratagem_ddp.strategy import DDPStrategy

__all__ = ["DDPStrategy", "DataParallelStrategy", "__version__", "register"]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "DDPStrategy": "stratagem_ddp.strategy",
        "DataParallelStrategy": "stratagem_ddp.dp",
        "register": "stratagem_ddp.registration",
    },
    "stratagem-ddp",
)
