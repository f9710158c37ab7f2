"""What one pipeline rank holds: its stages' share of the training state, and the activations of the
micro-batches its schedule keeps in flight. For the planner (``estimate_memory``, ``stratagem plan``)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from stratagem.pipelining.schedules import ScheduleKind, rank_stages
from stratagem.pipelining.split import StageSplit
from stratagem.strategies.memory import MemoryEstimate, ModelFootprint


@dataclass(frozen=True)
class PipelineShape:
    """How a pipeline runs, as the estimate needs it."""

    kind: ScheduleKind
    pp: int
    stages_per_rank: int
    micro_batches: int
    dp_shard: int = 1

    @property
    def num_stages(self) -> int:
        return self.pp * self.stages_per_rank


def stage_parameters(module: nn.Module, split: StageSplit) -> list[int]:
    """Parameter elements of each stage (a parameter two pieces share counted once, where it first appears)."""
    counted: set[int] = set()
    sizes = []
    for stage in range(split.num_stages):
        size = 0
        for piece in split.pieces(stage):
            holder_name, _, attribute = piece.rpartition(".")
            holder = module.get_submodule(holder_name)
            child = holder._modules.get(attribute)
            tensors = list(child.parameters()) if child is not None else [holder._parameters.get(attribute)]
            for tensor in tensors:
                if tensor is not None and id(tensor) not in counted:
                    counted.add(id(tensor))
                    size += tensor.numel()
        sizes.append(size)
    return sizes


def chunks_in_flight(shape: PipelineShape) -> int:
    """The most stage-chunks (one micro-batch through one stage) whose activations a rank keeps at once.

    GPipe runs every forward before any backward; 1F1B keeps at most ``pp`` micro-batches; the looped
    breadth-first schedule every micro-batch of every local stage; the interleaved and zero-bubble ones
    their warm-up (torch's count: the local stages after the first fill a round each, plus two per rank
    downstream), and one more.
    """
    m, v, pp = shape.micro_batches, shape.stages_per_rank, shape.pp
    if shape.kind.torch_class == "ScheduleGPipe":
        return m
    if shape.kind.torch_class == "Schedule1F1B":
        return min(m, pp)
    if shape.kind.torch_class == "ScheduleLoopedBFS":
        return m * v
    return min(m * v, (v - 1) * min(m, pp) + 2 * (pp - 1) + 1)


def bubble_fraction(shape: PipelineShape) -> float:
    """The share of a step each rank waits idle: ``(pp - 1) / (v m + pp - 1)``, half that for the zero-bubble
    schedules (their weight gradients fill part of it) and none with one stage."""
    if shape.pp == 1:
        return 0.0
    bubble = (shape.pp - 1) / (shape.stages_per_rank * shape.micro_batches + shape.pp - 1)
    return bubble / 2 if "ZeroBubble" in shape.kind.torch_class else bubble


def pipeline_estimate(footprint: ModelFootprint, shape: PipelineShape, split: StageSplit | None) -> MemoryEstimate:
    """The busiest rank: its stages' training state (sharded over ``dp_shard``, with one block gathered while
    it computes), and its stages' activations for the chunks in flight. Without a ``split`` (no module to cut)
    the stages are taken as equal."""
    share = 1 / shape.num_stages * shape.stages_per_rank
    if split is not None and footprint.module is not None and footprint.parameters:
        sizes = stage_parameters(footprint.module, split)
        busiest = max(
            sum(sizes[stage] for stage in rank_stages(shape.kind, rank, shape.pp, shape.stages_per_rank))
            for rank in range(shape.pp)
        )
        share = busiest / footprint.parameters
    state = int(footprint.training_state_bytes * share) // shape.dp_shard
    gathered = 2 * footprint.largest_unit_bytes if shape.dp_shard > 1 else 0
    per_chunk = footprint.activation_bytes / (shape.num_stages * shape.micro_batches)
    activations = int(per_chunk * chunks_in_flight(shape))
    return MemoryEstimate(
        device_bytes=state + gathered + activations, relative_step_time=1 / (1 - bubble_fraction(shape))
    )
