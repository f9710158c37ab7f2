"""Strategies: how a run is distributed."""

from stratagem.strategies.capabilities import (
    BackwardSyncControl,
    ChecksModuleBeforeLaunch,
    ChecksRunBeforeLaunch,
    DefersHostReads,
    EngineSteps,
    FeedsBatchesToDevice,
    LoaderStage,
    LoopSettings,
    OwnsAccumulation,
    OwnsTrainingStep,
    PreparesEachBackward,
    RebuildsDataLoaders,
    RefusesManualOptimization,
    RehearsesSetup,
    StepBoundary,
    StepBoundaryListener,
    StepsLRSchedulers,
    SuppliesOptimizer,
    TakesLoopSettings,
    TakesLRSchedulers,
    TakesMeshLayout,
)
from stratagem.strategies.compilation import BlockPolicy, CompileSettings
from stratagem.strategies.host_allocator import (
    check_release_host_memory,
    host_memory_is_tight,
    release_freed_host_memory,
    releases_host_memory,
)
from stratagem.strategies.init_contexts import skip_parameter_init
from stratagem.strategies.memory import LayoutSharding, MemoryEstimate, ModelFootprint, replicated_estimate
from stratagem.strategies.parallel import ParallelOptions, ParallelStrategy, split_parallel_options
from stratagem.strategies.single_device import SingleDeviceStrategy
from stratagem.strategies.single_process import SingleProcessCollectives
from stratagem.strategies.strategy import ReduceOp, Strategy, StrategyOptions

__all__ = [
    "BackwardSyncControl",
    "BlockPolicy",
    "ChecksModuleBeforeLaunch",
    "ChecksRunBeforeLaunch",
    "CompileSettings",
    "DefersHostReads",
    "EngineSteps",
    "FeedsBatchesToDevice",
    "LoaderStage",
    "LoopSettings",
    "LayoutSharding",
    "MemoryEstimate",
    "ModelFootprint",
    "OwnsAccumulation",
    "OwnsTrainingStep",
    "ParallelOptions",
    "ParallelStrategy",
    "PreparesEachBackward",
    "RebuildsDataLoaders",
    "RefusesManualOptimization",
    "RehearsesSetup",
    "ReduceOp",
    "SingleDeviceStrategy",
    "SingleProcessCollectives",
    "StepBoundary",
    "StepBoundaryListener",
    "StepsLRSchedulers",
    "Strategy",
    "StrategyOptions",
    "SuppliesOptimizer",
    "TakesLRSchedulers",
    "TakesLoopSettings",
    "TakesMeshLayout",
    "check_release_host_memory",
    "host_memory_is_tight",
    "release_freed_host_memory",
    "releases_host_memory",
    "replicated_estimate",
    "skip_parameter_init",
    "split_parallel_options",
]
