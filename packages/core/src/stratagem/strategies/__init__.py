"""Strategies: how a run is distributed."""

from stratagem.strategies.capabilities import (
    BackwardSyncControl,
    OwnsAccumulation,
    StepBoundary,
    StepBoundaryListener,
)
from stratagem.strategies.init_contexts import skip_parameter_init
from stratagem.strategies.parallel import ParallelStrategy
from stratagem.strategies.single_device import SingleDeviceStrategy
from stratagem.strategies.strategy import LoopSettings, ReduceOp, Strategy

__all__ = [
    "BackwardSyncControl",
    "LoopSettings",
    "OwnsAccumulation",
    "ParallelStrategy",
    "ReduceOp",
    "SingleDeviceStrategy",
    "StepBoundary",
    "StepBoundaryListener",
    "Strategy",
    "skip_parameter_init",
]
