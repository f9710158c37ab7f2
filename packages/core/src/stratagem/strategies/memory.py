"""What a model needs in memory, and what one rank of a strategy would hold of it: the planner's vocabulary."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from torch import nn


@dataclass(frozen=True)
class ModelFootprint:
    """The sizes, in bytes, of everything training a model keeps, before any strategy splits it.

    Built on the meta device by :func:`stratagem.planning.model_footprint`, so measuring costs nothing.
    """

    parameters: int
    """Number of parameter elements."""
    parameter_bytes: int
    """Parameters in the dtype they are created in (the precision's ``param_dtype``)."""
    gradient_bytes: int
    """Gradients of the trainable parameters (same dtype as the parameters)."""
    optimizer_state_bytes: int
    """Optimizer state (e.g. AdamW's two moments per trainable element), in the parameters' dtype."""
    activation_bytes: int
    """Outputs of every leaf module in one forward of ``example_input_array`` (0 when the module has none)."""
    largest_unit_bytes: int
    """Parameters of the largest repeated block (an element of a ``ModuleList``/``Sequential``), else of the
    whole model: what a sharded strategy gathers at once."""
    module: nn.Module | None = field(default=None, compare=False, repr=False)
    """The module built on the meta device, for strategies that size their own units from it."""

    @property
    def training_state_bytes(self) -> int:
        """Parameters, gradients and optimizer state: what a replicated strategy holds whole on every rank."""
        return self.parameter_bytes + self.gradient_bytes + self.optimizer_state_bytes


@dataclass(frozen=True)
class MemoryEstimate:
    """What one rank of a strategy holds at its peak, by where it lives, and how fast the strategy steps."""

    device_bytes: int
    """On the device the rank computes on (for the CPU accelerator this is host memory too)."""
    host_bytes: int = 0
    """In host memory besides the device (offloaded state)."""
    disk_bytes: int = 0
    """On disk (NVMe offload)."""
    relative_step_time: float = 1.0
    """Seconds per step relative to a replicated strategy (1.0) with the same devices: a declared rough
    ranking that lets the planner prefer the fastest strategy that fits."""

    def memory_bytes(self, device_is_host: bool) -> int:
        """Bytes a rank needs in the memory ``device_bytes`` lives in."""
        return self.device_bytes + self.host_bytes if device_is_host else self.device_bytes


def replicated_estimate(footprint: ModelFootprint) -> MemoryEstimate:
    """Every rank holds the whole model, its gradients and optimizer state, plus its activations."""
    return MemoryEstimate(device_bytes=footprint.training_state_bytes + footprint.activation_bytes)


TrainingState = Literal["parameters", "gradients", "optimizer_state"]
"""The three parts of the training state a strategy may shard or offload."""


def _no_buffers(footprint: ModelFootprint, shard_ranks: int) -> int:
    return 0


@dataclass(frozen=True)
class LayoutSharding:
    """How a strategy lays a model over the ranks of a cluster: what ``stratagem plan --world-size`` counts per
    rank for each mesh layout (:mod:`stratagem.mesh`) the strategy can take, without configuring it there."""

    dimensions: tuple[str, ...]
    """The mesh dimensions the strategy can size (``"dp_replicate"``, ``"dp_shard"``, ``"tp"``, ...); the others
    stay 1."""
    default: Mapping[str, int]
    """The layout it takes without layout options: a size per dimension, ``-1`` for the one taking the ranks left."""
    sharded: frozenset[TrainingState] = frozenset()
    """What is split over the ``"dp_shard"`` ranks; the rest is whole on each of them."""
    offloaded: frozenset[TrainingState] = frozenset()
    """What lives in host memory instead of the device."""
    master_copy: bool = False
    """Whether the optimizer steps an fp32 copy of the trainable parameters of its own (DeepSpeed's ZeRO), counted
    with the optimizer state and sharded as it is; the parameters and gradients are then held in the compute dtype
    (bf16 under ``bf16-mixed``)."""
    parameter_gathers: int = 0
    """All-gathers of the parameters per step over ``"dp_shard"`` (FSDP: 2, before forward and backward;
    ZeRO-1/2: 1, after the optimizer step)."""
    buffers: Callable[[ModelFootprint, int], int] = _no_buffers
    """Bytes of communication buffers one rank holds (gathered units, gradient buckets), from the whole model's
    footprint and the number of ``"dp_shard"`` ranks."""
    buffers_in_compute_dtype: bool = False
    """Whether the buffers hold tensors in the compute dtype (FSDP gathers bf16 parameters under ``bf16-mixed``)
    rather than the parameters' dtype, which :attr:`buffers` counts in."""
    recomputes: Callable[[nn.Module], bool] | None = None
    """Which modules recompute their activations in backward (activation checkpointing); ``None``: none."""
    options: Callable[[Mapping[str, int]], str] | None = None
    """The constructor options that give a layout other than :attr:`default`, as text (``None``: the layout's
    sizes are the option names)."""
