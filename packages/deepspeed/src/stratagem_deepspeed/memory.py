"""What one rank of a DeepSpeed engine holds, by ZeRO stage and offload target, read from its config."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stratagem.strategies import MemoryEstimate, ModelFootprint
from stratagem_deepspeed.config import offload_devices, zero_stage

STEP_TIME_BY_STAGE = {0: 1.0, 1: 1.1, 2: 1.15, 3: 1.3}
"""The engine and its reduce-scatters cost a little over DDP; stage 3 gathers parameters every forward."""
OFFLOADED_OPTIMIZER_STEP_TIME = 2.0
OFFLOADED_PARAMETERS_STEP_TIME = 2.5
NVME_STEP_TIME = 4.0
DEFAULT_BUCKET_ELEMENTS = 500_000_000
"""DeepSpeed's defaults for ``reduce_bucket_size`` and the NVMe parameter buffers."""
FP32_BYTES = 4


def deepspeed_estimate(footprint: ModelFootprint, config: Mapping[str, Any], world_size: int) -> MemoryEstimate:
    """ZeRO keeps its own fp32 copy of the parameters for the optimizer (stage 1 and up); stage 1 shards that
    copy and the optimizer state, stage 2 also the gradients, stage 3 also the parameters (gathering the
    largest blocks while they compute). Offloaded parts live in host memory, or on disk for ``nvme``."""
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
    gathered = 2 * footprint.largest_unit_bytes / max(1, footprint.parameter_bytes) * elements * element_bytes
    working_parameters = parameters + (gathered if stage == 3 and world > 1 else 0)
    master = shard(trainable * FP32_BYTES, 1) if stage >= 1 or bf16 else 0
    optimizer_state = shard(trainable * FP32_BYTES * states_per_element, 1)
    # The optimizer steps an fp32 gradient partition: a separate buffer in bf16, and a flattened copy at stages 1-2.
    fp32_gradients = shard(trainable * FP32_BYTES, 2) if bf16 or stage in (1, 2) else 0
    gradients = shard(trainable * element_bytes, 2) + fp32_gradients
    bucket_elements = min(elements, int(zero.get("reduce_bucket_size", DEFAULT_BUCKET_ELEMENTS)))
    buckets = bucket_elements * element_bytes if stage >= 1 else 0

    placed = {"device": 0.0, "cpu": 0.0, "nvme": 0.0}
    placed[offloads.get("param", "device")] += parameters
    placed["device"] += working_parameters - parameters
    placed[offloads.get("optimizer", "device")] += master + optimizer_state
    placed["device" if "optimizer" not in offloads else "cpu"] += gradients
    placed["device"] += buckets + footprint.activation_bytes
    if "nvme" in offloads.values():
        # Swapping goes through pinned host buffers of the bucket size.
        placed["cpu"] += bucket_elements * FP32_BYTES
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
