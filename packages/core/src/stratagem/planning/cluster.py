"""Plan a job for a cluster this process does not run on: for every strategy and every mesh layout of its world
size, what one rank holds and how long a step takes, by a simple model stated here.

Memory per rank (bytes):

- parameters, gradients and optimizer state: the model's, times the share of a tensor-parallel rank (measured by
  applying the module's own plan on the fake process group), over the pipeline stages, and over ``dp_shard`` for
  what the strategy shards (:class:`~stratagem.strategies.LayoutSharding`); offloaded state is host memory;
- activations: the outputs of every leaf module in one forward of one micro-batch (token ids of
  ``(batch_size, seq_len)``) on the meta device, in the compute dtype, over ``tp`` (every activation split, as
  with sequence parallelism); with the repeated blocks checkpointed, what lies outside them, each block's input
  and one block's own;
- communication buffers: what the strategy declares (gathered units, gradient buckets), times the tensor-parallel
  share.

A layout fits when its device total is within :data:`~stratagem.planning.SAFETY_MARGIN` of the device memory.

Step time (seconds), for one micro-batch per data-parallel rank; layouts are ranked by step time per token:

- compute: 3 x the forward's FLOPs (forward and backward; torch's ``FlopCounterMode``, attention included; 4 x
  when the blocks are checkpointed) over ``tp x pp``, at ``mfu`` of the device's dense bf16 peak, plus the
  pipeline bubble ``(pp - 1) / micro_batches``;
- data-parallel traffic, ring collectives over the slower link its group spans (within a node, or across nodes):
  gathers of the parameters (in the compute dtype) and a reduce-scatter of the gradients over ``dp_shard``, an
  all-reduce of the gradients a rank keeps over ``dp_replicate``; it overlaps compute, so the step takes the longer;
- tensor-parallel traffic: four all-reduces of every block's output per step (two in forward, two in backward, as
  in Megatron-LM), on the critical path; pipeline traffic: each block boundary's activation sent forward and back;
- offload: offloaded parameters copied to the device for each gather, gradients copied back, over the host link,
  on the critical path (the optimizer's step on the host is not counted).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from torch import nn

from stratagem.planning import layouts as layout_rules
from stratagem.planning.devices import DeviceSpec
from stratagem.planning.planner import SAFETY_MARGIN
from stratagem.planning.workload import Workload, measure_workload
from stratagem.precision import Precision
from stratagem.strategies.memory import LayoutSharding, ModelFootprint, TrainingState

DEFAULT_MFU = 0.4
"""The share of the bf16 peak a step's compute is assumed to reach (torchtitan reports 30-50% for Llama 3 on H100)."""

STATES: tuple[TrainingState, ...] = ("parameters", "gradients", "optimizer_state")
FP32_BYTES = 4


@dataclass(frozen=True)
class ClusterTarget:
    """The cluster a job is planned for."""

    world_size: int
    devices_per_node: int
    device: DeviceSpec
    mfu: float = DEFAULT_MFU
    micro_batches: int = 1
    """Micro-batches per step: only pipeline layouts use more than one (their bubble shrinks with it)."""

    @property
    def num_nodes(self) -> int:
        return max(1, self.world_size // self.devices_per_node)


@dataclass(frozen=True)
class RankMemory:
    """What one rank holds, by part (bytes)."""

    parameters: int
    gradients: int
    optimizer_state: int
    activations: int
    buffers: int
    host: int
    """The offloaded part, in host memory instead of the device (not in :attr:`device`)."""

    @property
    def device(self) -> int:
        return self.parameters + self.gradients + self.optimizer_state + self.activations + self.buffers - self.host

    @property
    def model_state(self) -> int:
        """Parameters, gradients and optimizer state, wherever they live."""
        return self.parameters + self.gradients + self.optimizer_state


@dataclass(frozen=True)
class StepTime:
    """The step-time model's parts (seconds)."""

    compute: float
    data_parallel: float
    tensor_parallel: float
    pipeline: float
    offload: float = 0.0

    @property
    def total(self) -> float:
        return max(self.compute, self.data_parallel) + self.tensor_parallel + self.pipeline + self.offload


@dataclass(frozen=True)
class LayoutCandidate:
    """One strategy in one layout, as planned."""

    strategies: list[str]
    """The registered names that plan alike (``fsdp``, ``fsdp_spawn``, ...), the first shown."""
    layout: dict[str, int]
    memory: RankMemory
    step: StepTime | None
    """``None`` when the forward could not be measured (no FLOPs)."""
    tokens_per_step: int
    options: str
    """The strategy options that give this layout (empty for its default)."""
    is_default: bool
    """Whether this is the layout the strategy takes without layout options."""
    problem: str | None = None
    """Why it does not fit (or cannot run); ``None`` when it fits."""

    @property
    def name(self) -> str:
        return self.strategies[0]

    @property
    def fits(self) -> bool:
        return self.problem is None

    def tokens_per_second_per_device(self, world_size: int) -> float | None:
        if self.step is None or not self.tokens_per_step:
            return None
        return self.tokens_per_step / self.step.total / world_size


@dataclass(frozen=True)
class ClusterPlan:
    """Every candidate, the workload they were planned from, and what was left out and why."""

    target: ClusterTarget
    workload: Workload
    candidates: list[LayoutCandidate]
    left_out: dict[str, str] = field(default_factory=dict)
    """Registered names not planned, with the reason (not installed, declares no layout, ...)."""
    notes: list[str] = field(default_factory=list)
    default_strategy: str = "ddp"

    @property
    def ranked(self) -> list[LayoutCandidate]:
        """Fitting candidates fastest first (time per token), then the others by device memory."""
        fitting = sorted((c for c in self.candidates if c.fits), key=_step_key)
        rest = sorted((c for c in self.candidates if not c.fits), key=lambda c: c.memory.device)
        return fitting + rest

    @property
    def auto_choice(self) -> LayoutCandidate | None:
        """What ``strategy="auto"`` takes, each name in its default layout: the default strategy when it fits,
        else the fastest that fits by this model."""
        defaults = [candidate for candidate in self.candidates if candidate.is_default and candidate.fits]
        for candidate in defaults:
            if self.default_strategy in candidate.strategies:
                return candidate
        return min(defaults, key=_step_key, default=None)


def _step_key(candidate: LayoutCandidate) -> float:
    # Layouts with more data-parallel ranks step through more tokens: compare the time per token.
    if candidate.step is None or candidate.tokens_per_step == 0:
        return math.inf
    return candidate.step.total / candidate.tokens_per_step


def plan_cluster(
    module: nn.Module,
    strategies: Mapping[str, Any],
    target: ClusterTarget,
    precision: Precision | None = None,
    batch_size: int | None = None,
    seq_len: int | None = None,
    default_strategy: str = "ddp",
    workload: Workload | None = None,
) -> ClusterPlan:
    """Plan ``module`` on ``target`` under each of ``strategies`` (registered name -> unconfigured instance, or the
    text of why it cannot be created here); ``workload``, when measured already, is ``module``'s at that
    micro-batch."""
    from stratagem.planning.rehearsal import tensor_parallel_split

    precision = precision or Precision()
    workload = workload or measure_workload(module, precision, batch_size, seq_len)
    notes = list(workload.notes)
    left_out: dict[str, str] = {}
    groups: dict[Any, tuple[list[str], LayoutSharding]] = {}
    for name, strategy in strategies.items():
        if isinstance(strategy, str):
            left_out[name] = strategy
            continue
        sharding = strategy.layout_sharding(target.devices_per_node)
        if sharding is None:
            left_out[name] = f"{type(strategy).__name__} does not declare how it lays a model over a cluster"
            continue
        key = _sharding_key(sharding, type(strategy))
        groups.setdefault(key, ([], replace(sharding, buffers=_remembered(sharding.buffers))))[0].append(name)
    planned = {
        key: (
            names,
            sharding,
            layout_rules.layouts_for(sharding.dimensions, target.world_size, target.devices_per_node),
        )
        for key, (names, sharding) in groups.items()
    }
    largest_tp = max((layout["tp"] for _, _, found in planned.values() for layout in found), default=1)
    split = None
    if largest_tp > 1:
        split = tensor_parallel_split(module, precision, largest_tp)
        notes += [f"tp={largest_tp}: {problem}" for problem in split.problems]
        if split.split_elements == 0:
            notes.append(
                "layouts with tp > 1 split nothing: the module's configure_model applies no tensor-parallel plan "
                "to self.device_mesh['tp'] (they are listed as not fitting)"
            )
    candidates: list[LayoutCandidate] = []
    for names, sharding, found in planned.values():
        try:
            default = layout_rules.resolved(sharding.default, target.world_size)
        except ValueError as error:
            notes.append(f"{names[0]}: its default layout cannot run here ({error}); its other layouts are planned")
            default = None
        for layout in found:
            share = split.share(layout["tp"]) if split is not None else 1.0
            candidates.append(_candidate(names, sharding, layout, layout == default, workload, target, share))
    if not candidates:
        reasons = "; ".join(f"{name}: {reason}" for name, reason in left_out.items())
        raise ValueError(
            f"No strategy could be planned for {target.world_size} ranks ({reasons}). A cluster plan needs a "
            "strategy that declares its layouts: install stratagem-ddp, stratagem-fsdp or stratagem-deepspeed."
        )
    return ClusterPlan(target, workload, candidates, left_out, notes, default_strategy)


def _remembered(buffers: Callable[[ModelFootprint, int], int]) -> Callable[[ModelFootprint, int], int]:
    """``buffers`` computed once per footprint and shard count: FSDP's walks the model's units, and every layout of
    a world asks again (a 70B model at 512 ranks: a second of the plan's eight)."""
    known: dict[tuple[int, int], int] = {}

    def remembered(footprint: ModelFootprint, shards: int) -> int:
        key = (id(footprint), shards)
        if key not in known:
            known[key] = buffers(footprint, shards)
        return known[key]

    return remembered


def _sharding_key(sharding: LayoutSharding, kind: type) -> tuple[Any, ...]:
    # Names whose declarations agree plan alike; the buffers' function is compared by what it computes from.
    buffers = sharding.buffers
    arguments = getattr(buffers, "keywords", None)
    function = getattr(buffers, "func", buffers)
    return (
        kind.__name__,
        sharding.dimensions,
        tuple(sorted(sharding.default.items())),
        sharding.sharded,
        sharding.offloaded,
        sharding.parameter_gathers,
        function,
        repr(arguments),
    )


def rank_memory(sharding: LayoutSharding, layout: Mapping[str, int], workload: Workload, tp_share: float) -> RankMemory:
    """What one rank of ``layout`` holds (see the module's docstring for the model)."""
    footprint = workload.footprint
    shards = layout["dp_shard"]
    stage = tp_share / layout["pp"]
    element_bytes = footprint.parameter_bytes / max(1, footprint.parameters)
    held = 1.0
    master = 0.0
    if sharding.master_copy:
        held = workload.compute_element_bytes / element_bytes
        master = FP32_BYTES * footprint.gradient_bytes / element_bytes
    held_buffers = workload.compute_element_bytes if sharding.buffers_in_compute_dtype else element_bytes
    whole = {
        "parameters": footprint.parameter_bytes * held,
        "gradients": footprint.gradient_bytes * held,
        "optimizer_state": footprint.optimizer_state_bytes + master,
    }
    parts = {kind: int(whole[kind] * stage / (shards if kind in sharding.sharded else 1)) for kind in STATES}
    return RankMemory(
        parameters=parts["parameters"],
        gradients=parts["gradients"],
        optimizer_state=parts["optimizer_state"],
        activations=int(kept_activation_bytes(sharding, workload) / layout["tp"]),
        buffers=int(sharding.buffers(footprint, shards) * stage * (held_buffers / element_bytes)),
        host=sum(parts[kind] for kind in sharding.offloaded),
    )


def recomputes_blocks(sharding: LayoutSharding, workload: Workload) -> bool:
    """Whether the strategy checkpoints the model's repeated blocks (the granularity this model counts)."""
    return sharding.recomputes is not None and workload.block is not None and sharding.recomputes(workload.block)


def kept_activation_bytes(sharding: LayoutSharding, workload: Workload) -> int:
    """The activations one micro-batch keeps for backward: all of them, or with the blocks checkpointed, what lies
    outside the blocks, each block's input, and one block's own while it is recomputed."""
    total = workload.footprint.activation_bytes
    if not recomputes_blocks(sharding, workload):
        return total
    inside = workload.block_activation_bytes
    return total - sum(inside) + sum(workload.block_output_bytes) + max(inside, default=0)


def step_time(
    sharding: LayoutSharding,
    layout: Mapping[str, int],
    workload: Workload,
    target: ClusterTarget,
    tp_share: float,
) -> StepTime | None:
    """The step-time model's parts for one rank of ``layout`` (see the module's docstring)."""
    if workload.forward_flops <= 0:
        return None
    compute_element_bytes = workload.compute_element_bytes
    device = target.device
    tp, pp = layout["tp"], layout["pp"]
    bubble = (pp - 1) / max(1, target.micro_batches)
    # Forward and backward (twice the forward); a checkpointed block runs its forward once more.
    passes = 4 if recomputes_blocks(sharding, workload) else 3
    compute = passes * workload.forward_flops / (tp * pp) / (device.bf16_flops * target.mfu) * (1 + bubble)
    footprint = workload.footprint
    stage = tp_share / pp
    elements = footprint.parameters * stage
    gradient_bytes = footprint.gradient_bytes * stage

    def bandwidth(dimension: str) -> float:
        within = layout_rules.group_within_node(layout, dimension, target.devices_per_node)
        return device.intra_node_bytes_per_s if within else device.inter_node_bytes_per_s

    data_parallel = 0.0
    shards, replicas = layout["dp_shard"], layout["dp_replicate"]
    if shards > 1 and sharding.sharded:
        ring = (shards - 1) / shards
        volume = ring * (sharding.parameter_gathers * elements * compute_element_bytes + gradient_bytes)
        data_parallel += volume / bandwidth("dp_shard")
        gradient_bytes /= shards
    elif shards > 1:
        # Ranks that shard nothing (ZeRO stage 0) all-reduce their gradients like replicas.
        data_parallel += 2 * (shards - 1) / shards * gradient_bytes / bandwidth("dp_shard")
    if replicas > 1:
        data_parallel += 2 * (replicas - 1) / replicas * gradient_bytes / bandwidth("dp_replicate")
    boundary = sum(workload.block_output_bytes) / max(1, len(workload.block_output_bytes))
    activation_scale = compute_element_bytes / _element_bytes(workload)
    tensor_parallel = 0.0
    if tp > 1:
        volume = 4 * sum(workload.block_output_bytes) * activation_scale * 2 * (tp - 1) / tp / pp
        tensor_parallel = volume / bandwidth("tp")
    pipeline = 0.0
    if pp > 1:
        pipeline = 2 * boundary * activation_scale * target.micro_batches / bandwidth("pp")
    memory = rank_memory(sharding, layout, workload, tp_share)
    crossing = 0.0
    if "parameters" in sharding.offloaded:
        crossing += max(1, sharding.parameter_gathers) * memory.parameters
    if "gradients" in sharding.offloaded or "optimizer_state" in sharding.offloaded:
        crossing += memory.gradients
    return StepTime(compute, data_parallel, tensor_parallel, pipeline, crossing / device.host_bytes_per_s)


def _element_bytes(workload: Workload) -> float:
    footprint = workload.footprint
    return footprint.parameter_bytes / max(1, footprint.parameters)


def _candidate(
    names: list[str],
    sharding: LayoutSharding,
    layout: dict[str, int],
    is_default: bool,
    workload: Workload,
    target: ClusterTarget,
    tp_share: float,
) -> LayoutCandidate:
    memory = rank_memory(sharding, layout, workload, tp_share)
    step = step_time(sharding, layout, workload, target, tp_share)
    problem = None
    blocks = len(workload.block_output_bytes)
    if layout["tp"] > 1 and tp_share >= 1.0:
        problem = "the module splits nothing over tp"
    elif layout["pp"] > 1 and 0 < blocks < layout["pp"]:
        problem = f"{layout['pp']} pipeline stages, but the module has {blocks} blocks to cut"
    elif memory.device > SAFETY_MARGIN * target.device.memory_bytes:
        problem = "does not fit"
    shape = workload.micro_batch
    tokens = math.prod(shape) * layout["dp_replicate"] * layout["dp_shard"] if shape else 0
    if sharding.options is not None:
        options = sharding.options(layout)
    else:
        options = ", ".join(f"{name}={layout[name]}" for name in sharding.dimensions)
    return LayoutCandidate(list(names), layout, memory, step, tokens, options, is_default, problem)


def describe_rows(plan: ClusterPlan, limit: int | None) -> Sequence[LayoutCandidate]:
    """The candidates a table shows: the ranked list cut at ``limit``, keeping each strategy's best and the auto
    choice."""
    ranked = plan.ranked
    if limit is None or len(ranked) <= limit:
        return ranked
    shown = ranked[:limit]
    keep = {id(candidate) for candidate in shown}
    best: dict[str, LayoutCandidate] = {}
    for candidate in ranked:
        best.setdefault(candidate.name, candidate)
    extra = [*best.values()]
    if plan.auto_choice is not None:
        extra.append(plan.auto_choice)
    for candidate in extra:
        if id(candidate) not in keep:
            shown.append(candidate)
            keep.add(id(candidate))
    return shown
