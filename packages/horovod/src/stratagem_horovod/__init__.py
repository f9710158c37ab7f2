"""stratagem-horovod: ``Trainer(strategy="horovod")``, gradients averaged by horovod's DistributedOptimizer.

Importing this package is cheap: the strategy (and torch, and horovod) load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stratagem.exports import lazy_exports

if TYPE_CHECKING:
    from stratagem_horovod.environment import HorovodrunEnvironment
    from stratagem_horovod.options import COMPRESSIONS
    from stratagem_horovod.strategy import HorovodStrategy

__all__ = ["COMPRESSIONS", "HorovodStrategy", "HorovodrunEnvironment", "__version__"]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "COMPRESSIONS": "stratagem_horovod.options",
        "HorovodStrategy": "stratagem_horovod.strategy",
        "HorovodrunEnvironment": "stratagem_horovod.environment",
    },
    "stratagem-horovod",
)
