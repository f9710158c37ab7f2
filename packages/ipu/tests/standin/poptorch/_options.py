"""``poptorch.Options`` with the setters and attribute names PopTorch documents."""

from __future__ import annotations

import enum
from typing import Any


class OutputMode(enum.Enum):
    """Which micro-batches' outputs a call returns."""

    All = 0
    Final = 1
    EveryN = 2
    Sum = 3
    Default = 4


class ReductionType(enum.Enum):
    """How gradients of the micro-batches of one step are combined."""

    Sum = 0
    Mean = 1
    NoReduction = 2


def _positive(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}({value!r}): expected a positive int")
    return value


class _TrainingOptions:
    def __init__(self) -> None:
        self.gradient_accumulation = 1
        self.accumulation_and_replication_reduction_type = ReductionType.Mean

    def gradientAccumulation(self, gradient_accumulation: int) -> _TrainingOptions:
        self.gradient_accumulation = _positive("gradientAccumulation", gradient_accumulation)
        return self

    def accumulationAndReplicationReductionType(self, reduction_type: ReductionType) -> _TrainingOptions:
        if reduction_type not in (ReductionType.Sum, ReductionType.Mean):
            raise ValueError(f"accumulationAndReplicationReductionType({reduction_type!r}): expected Sum or Mean")
        self.accumulation_and_replication_reduction_type = reduction_type
        return self


class Options:
    """Options of one executor (PopTorch's names: ``deviceIterations``, ``replicationFactor`` ...)."""

    def __init__(self) -> None:
        self.device_iterations = 1
        self.replication_factor = 1
        self.output_mode = OutputMode.Default
        self.output_return_period = 1
        self.random_seed: int | None = None
        self.Training = _TrainingOptions()

    def deviceIterations(self, device_iterations: int) -> Options:
        self.device_iterations = _positive("deviceIterations", device_iterations)
        return self

    def replicationFactor(self, replication_factor: int) -> Options:
        self.replication_factor = _positive("replicationFactor", replication_factor)
        return self

    def outputMode(self, output_mode: OutputMode, output_return_period: int | None = None) -> Options:
        if not isinstance(output_mode, OutputMode):
            raise TypeError(f"outputMode({output_mode!r}): expected a poptorch.OutputMode")
        self.output_mode = output_mode
        self.output_return_period = output_return_period or 1
        return self

    def randomSeed(self, random_seed: int) -> Options:
        self.random_seed = int(random_seed)
        return self

    def toDict(self) -> dict[str, Any]:
        return {
            "device_iterations": self.device_iterations,
            "replication_factor": self.replication_factor,
            "gradient_accumulation": self.Training.gradient_accumulation,
            "output_mode": self.output_mode.name,
            "random_seed": self.random_seed,
        }
