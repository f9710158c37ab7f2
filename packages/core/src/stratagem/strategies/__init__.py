"""Strategies: how a run is distributed."""

from stratagem.strategies.capabilities import BackwardSyncControl, OwnsAccumulation
from stratagem.strategies.init_contexts import skip_parameter_init
from stratagem.strategies.memory import MemoryEstimate, ModelFootprint, replicated_estimate
from stratagem.strategies.parallel import ParallelStrategy
from stratagem.strategies.single_device import SingleDeviceStrategy
from stratagem.strategies.strategy import LoopSettings, ReduceOp, Strategy

__all__ = [
    "BackwardSyncControl",
    "LoopSettings",
    "MemoryEstimate",
    "ModelFootprint",
    "OwnsAccumulation",
    "ParallelStrategy",
    "ReduceOp",
    "SingleDeviceStrategy",
    "Strategy",
    "replicated_estimate",
    "skip_parameter_init",
]
