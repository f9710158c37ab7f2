"""stratagem-horovod: ``Trainer(strategy="horovod")``, gradients averaged by horovod's DistributedOptimizer."""

from stratagem_horovod.options import COMPRESSIONS
from stratagem_horovod.strategy import HorovodStrategy

__all__ = ["COMPRESSIONS", "HorovodStrategy"]
