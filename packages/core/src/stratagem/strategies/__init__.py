"""Strategies: how a run is distributed."""

from stratagem.strategies.capabilities import BackwardSyncControl, OwnsAccumulation
from stratagem.strategies.init_contexts import skip_parameter_init
from stratagem.strategies.parallel import ParallelOptions, ParallelStrategy, split_parallel_options
from stratagem.strategies.single_device import SingleDeviceStrategy
from stratagem.strategies.strategy import LoopSettings, ReduceOp, Strategy, StrategyOptions

__all__ = [
    "BackwardSyncControl",
    "LoopSettings",
    "OwnsAccumulation",
    "ParallelOptions",
    "ParallelStrategy",
    "ReduceOp",
    "SingleDeviceStrategy",
    "Strategy",
    "StrategyOptions",
    "skip_parameter_init",
    "split_parallel_options",
]
