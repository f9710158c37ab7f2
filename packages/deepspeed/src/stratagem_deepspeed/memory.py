"""What one rank of a DeepSpeed engine holds, by ZeRO stage and offload target, read from its config."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stratagem.strategies import LayoutSharding, MemoryEstimate, ModelFootprint
from stratagem.strategies.memory import TrainingState
from stratagem_deepspeed.buffer_sizes import DEEPSPEED_SUB_GROUP_ELEMENTS
from stratagem_deepspeed.config import offload_devices, zero_stage

STEP_TIME_BY_STAGE = {0: 1.0, 1: 1.1, 2: 1.15, 3: 1.3}
"""The engine and its reduce-scatters cost a little over DDP; stage 3 gathers parameters every forward."""
OFFLOADED_OPTIMIZER_STEP_TIME = 2.0
OFFLOADED_PARAMETERS_STEP_TIME = 2.5
NVME_STEP_TIME = 4.0
RELEASING_STEP_TIME = 1.45
"""How much longer a step takes when freed memory goes back to the system at once (ZeRO-3 on the CPU, 109M
parameters: 4.23-4.29 s against 2.87-2.97 s): every large allocation starts from fresh pages."""
DEFAULT_BUCKET_ELEMENTS = 500_000_000
"""DeepSpeed's default ``reduce_bucket_size`` (a config without one gets it)."""
DEFAULT_MAX_LIVE_PARAMETERS = 1_000_000_000
"""DeepSpeed's default ``stage3_max_live_parameters``."""
DEFAULT_PARAMETER_SWAP_BUFFERS = (5, 100_000_000)
"""DeepSpeed's default ``offload_param`` ``buffer_count`` and ``buffer_size`` (elements)."""
DEFAULT_OPTIMIZER_SWAP_BUFFERS = 4
"""DeepSpeed's default ``offload_optimizer`` ``buffer_count``."""
DEFAULT_MAX_IN_CPU = 1_000_000_000
"""DeepSpeed's default ``offload_param.max_in_cpu``: NVMe-offloaded parameters it keeps in host memory anyway."""
FP32_BYTES = 4


def deepspeed_estimate(footprint: ModelFootprint, config: Mapping[str, Any], world_size: int) -> MemoryEstimate:
    """ZeRO keeps its own fp32 copy of the parameters for the optimizer (stage 1 and up); stage 1 shards that
    copy and the optimizer state, stage 2 also the gradients, stage 3 also the parameters (gathering blocks
    while they compute). Offloaded parts live in host memory, or on disk for ``nvme``.

    Besides the states it counts the buffers DeepSpeed allocates whole whatever the model: the reduce bucket,
    the gathered-parameter window of stage 3, the temporaries of the optimizer's step over a partition (a torch
    Adam makes one per state), and the page-locked swap buffers of NVMe offload. At stage 3 the peak may come at
    the fit's end instead, when every rank gathers the whole model.
    """
    stage = zero_stage(config)
    zero = config.get("zero_optimization", {})
    offloads = offload_devices(config)
    world = max(1, world_size)
    elements = footprint.parameters
    bf16 = bool((config.get("bf16") or {}).get("enabled"))
    element_bytes = 2 if bf16 else footprint.parameter_bytes / max(1, elements)
    states_per_element = footprint.optimizer_state_bytes / max(1, footprint.gradient_bytes)
    trainable = footprint.gradient_bytes / (footprint.parameter_bytes / max(1, elements))

    def shard(total: float, from_stage: int) -> float:
        return total / world if stage >= from_stage else total

    parameters = shard(elements * element_bytes, 3)
    largest_unit = footprint.largest_unit_bytes / max(1, footprint.parameter_bytes) * elements
    live = min(
        elements, max(2 * largest_unit, int(zero.get("stage3_max_live_parameters", DEFAULT_MAX_LIVE_PARAMETERS)))
    )
    gathered = live * element_bytes if stage == 3 and world > 1 else 0
    master = shard(trainable * FP32_BYTES, 1) if stage >= 1 or bf16 else 0
    optimizer_state = shard(trainable * FP32_BYTES * states_per_element, 1)
    # Stage 3 steps its partition one sub-group at a time; stages 1-2 step it whole.
    sub_group = shard(trainable, 1)
    if stage == 3:
        sub_group = min(sub_group, int(zero.get("sub_group_size", DEEPSPEED_SUB_GROUP_ELEMENTS)))
    step_temporaries = sub_group * FP32_BYTES * states_per_element if stage >= 1 else 0
    # The optimizer steps an fp32 gradient partition: a separate buffer in bf16, and a flattened copy at stages 1-2.
    fp32_gradients = shard(trainable * FP32_BYTES, 2) if bf16 or stage in (1, 2) else 0
    gradients = shard(trainable * element_bytes, 2) + fp32_gradients
    # Allocated whole up front, however small the model.
    buckets = int(zero.get("reduce_bucket_size", DEFAULT_BUCKET_ELEMENTS)) * element_bytes if stage >= 1 else 0

    placed = {"device": 0.0, "cpu": 0.0, "nvme": 0.0}
    if offloads.get("param") == "nvme":
        in_host = min(
            parameters / element_bytes, int((zero.get("offload_param") or {}).get("max_in_cpu", DEFAULT_MAX_IN_CPU))
        )
        placed["cpu"] += in_host * element_bytes
        placed["nvme"] += parameters - in_host * element_bytes
        count, size = DEFAULT_PARAMETER_SWAP_BUFFERS
        offload_param = zero.get("offload_param") or {}
        swap_elements = int(offload_param.get("buffer_count", count)) * int(offload_param.get("buffer_size", size))
        placed["cpu"] += swap_elements * element_bytes
    else:
        placed[offloads.get("param", "device")] += parameters
    placed["device"] += gathered
    optimizer_place = offloads.get("optimizer", "device")
    placed[optimizer_place] += master + optimizer_state
    step_place = "device" if optimizer_place == "device" else "cpu"
    placed[step_place] += step_temporaries
    if optimizer_place == "nvme":
        count = int((zero.get("offload_optimizer") or {}).get("buffer_count", DEFAULT_OPTIMIZER_SWAP_BUFFERS))
        placed["cpu"] += count * sub_group * FP32_BYTES
    placed["device" if "optimizer" not in offloads else "cpu"] += gradients
    placed["device"] += buckets + footprint.activation_bytes
    if stage == 3:
        # The fit's end gathers the whole model into every rank, for use after fit (stage_3_release). By then
        # the step's temporaries, the gathered window and the activations are gone and the optimizer's moments in
        # memory are freed; the partitions, the master copy, gradients, buckets and NVMe's buffers stay.
        freed = step_temporaries + gathered + footprint.activation_bytes
        freed += optimizer_state if optimizer_place != "nvme" else 0
        end_of_fit = placed["device"] + placed["cpu"] - freed + elements * element_bytes
        placed["device"] += max(0.0, end_of_fit - placed["device"] - placed["cpu"])
    step_time = STEP_TIME_BY_STAGE.get(stage, 1.3)
    if "nvme" in offloads.values():
        step_time = NVME_STEP_TIME
    elif "param" in offloads:
        step_time = OFFLOADED_PARAMETERS_STEP_TIME
    elif "optimizer" in offloads:
        step_time = OFFLOADED_OPTIMIZER_STEP_TIME
    return MemoryEstimate(
        device_bytes=int(placed["device"]),
        host_bytes=int(placed["cpu"]),
        disk_bytes=int(placed["nvme"]),
        relative_step_time=step_time,
    )


_SHARDED_BY_STAGE: dict[int, frozenset[TrainingState]] = {
    0: frozenset(),
    1: frozenset(("optimizer_state",)),
    2: frozenset(("optimizer_state", "gradients")),
    3: frozenset(("optimizer_state", "gradients", "parameters")),
}


def zero_layout_sharding(config: Mapping[str, Any]) -> LayoutSharding:
    """How ZeRO lays a model over the data-parallel ranks, from a config: its stage shards the optimizer state (1),
    the gradients (2) and the parameters (3) over every rank, each with an fp32 master copy for the optimizer; the
    offloaded parts live in host memory (or NVMe, which the planner counts as host)."""
    stage = min(zero_stage(config), 3)
    offloads = offload_devices(config)
    offloaded: set[TrainingState] = set()
    if "optimizer" in offloads:
        offloaded |= {"optimizer_state", "gradients"}
    if "param" in offloads:
        offloaded.add("parameters")
    zero = dict(config.get("zero_optimization", {}))

    def buffers(footprint: ModelFootprint, shard_ranks: int) -> int:
        element_bytes = footprint.parameter_bytes / max(1, footprint.parameters)
        bucket = int(zero.get("reduce_bucket_size", DEFAULT_BUCKET_ELEMENTS)) if stage >= 1 else 0
        largest_unit = footprint.largest_unit_bytes / max(1e-9, element_bytes)
        live = int(zero.get("stage3_max_live_parameters", DEFAULT_MAX_LIVE_PARAMETERS))
        window = min(footprint.parameters, max(2 * largest_unit, live)) if stage == 3 and shard_ranks > 1 else 0
        return int((min(bucket, footprint.parameters) + window) * element_bytes)

    return LayoutSharding(
        dimensions=("dp_shard",),
        default={"dp_shard": -1},
        sharded=_SHARDED_BY_STAGE[stage],
        offloaded=frozenset(offloaded),
        master_copy=stage >= 1,
        buffers_in_compute_dtype=True,
        parameter_gathers=2 if stage == 3 else (1 if stage >= 1 else 0),
        buffers=buffers,
    )
