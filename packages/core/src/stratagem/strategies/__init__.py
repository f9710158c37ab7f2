"""Strategies: how a run is distributed."""

from stratagem.strategies.capabilities import BackwardSyncControl, FeedsBatchesToDevice, OwnsAccumulation
from stratagem.strategies.init_contexts import skip_parameter_init
from stratagem.strategies.parallel import ParallelStrategy
from stratagem.strategies.single_device import SingleDeviceStrategy
from stratagem.strategies.strategy import LoopSettings, ReduceOp, Strategy

__all__ = [
    "BackwardSyncControl",
    "FeedsBatchesToDevice",
    "LoopSettings",
    "OwnsAccumulation",
    "ParallelStrategy",
    "ReduceOp",
    "SingleDeviceStrategy",
    "Strategy",
    "skip_parameter_init",
]
