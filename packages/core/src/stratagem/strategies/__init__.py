"""Strategies: how a run is distributed."""

from stratagem.strategies.capabilities import (
    BackwardSyncControl,
    EngineSteps,
    FeedsBatchesToDevice,
    LoaderStage,
    OwnsAccumulation,
    OwnsTrainingStep,
    PreparesEachBackward,
    RebuildsDataLoaders,
    StepBoundary,
    StepBoundaryListener,
)
from stratagem.strategies.compilation import BlockPolicy, CompileSettings
from stratagem.strategies.host_allocator import (
    check_release_host_memory,
    release_freed_host_memory,
    releases_host_memory,
)
from stratagem.strategies.init_contexts import skip_parameter_init
from stratagem.strategies.memory import MemoryEstimate, ModelFootprint, replicated_estimate
from stratagem.strategies.parallel import ParallelOptions, ParallelStrategy, split_parallel_options
from stratagem.strategies.single_device import SingleDeviceStrategy
from stratagem.strategies.strategy import LoopSettings, ReduceOp, Strategy, StrategyOptions

__all__ = [
    "BackwardSyncControl",
    "BlockPolicy",
    "CompileSettings",
    "EngineSteps",
    "FeedsBatchesToDevice",
    "LoaderStage",
    "LoopSettings",
    "MemoryEstimate",
    "ModelFootprint",
    "OwnsAccumulation",
    "OwnsTrainingStep",
    "ParallelOptions",
    "ParallelStrategy",
    "PreparesEachBackward",
    "RebuildsDataLoaders",
    "ReduceOp",
    "SingleDeviceStrategy",
    "StepBoundary",
    "StepBoundaryListener",
    "Strategy",
    "StrategyOptions",
    "check_release_host_memory",
    "release_freed_host_memory",
    "releases_host_memory",
    "replicated_estimate",
    "skip_parameter_init",
    "split_parallel_options",
]
