"""The names this package registers. Imports nothing heavy: targets are ``"module:Class"`` strings."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stratagem.registry import Registry

REQUIREMENT = "deepspeed>=0.19.8"
STRATEGY_TARGET = "stratagem_deepspeed.strategy:DeepSpeedStrategy"
CHECKPOINT_IO_TARGET = "stratagem_deepspeed.checkpoint_io:DeepSpeedCheckpointIO"

_OFFLOAD_EVERYTHING_TO_NVME: dict[str, Any] = {
    "stage": 3,
    "offload_optimizer": True,
    "offload_parameters": True,
    "remote_device": "nvme",
    "offload_params_device": "nvme",
    "offload_optimizer_device": "nvme",
}

STRATEGY_ALIASES: dict[str, tuple[dict[str, Any], str]] = {
    "deepspeed": ({}, "DeepSpeed ZeRO stage 2 (optimizer state and gradients sharded); options or a config refine it."),
    "deepspeed_stage_1": ({"stage": 1}, "DeepSpeed ZeRO stage 1: optimizer state sharded across processes."),
    "deepspeed_stage_1_offload": (
        {"stage": 1, "offload_optimizer": True},
        "DeepSpeed ZeRO stage 1 with the optimizer state and step offloaded to CPU memory.",
    ),
    "deepspeed_stage_2": ({"stage": 2}, "DeepSpeed ZeRO stage 2: optimizer state and gradients sharded."),
    "deepspeed_stage_2_offload": (
        {"stage": 2, "offload_optimizer": True},
        "DeepSpeed ZeRO stage 2 with the optimizer state and step offloaded to CPU memory.",
    ),
    "deepspeed_stage_3": (
        {"stage": 3},
        "DeepSpeed ZeRO stage 3: parameters, gradients and optimizer state sharded; modules built sharded.",
    ),
    "deepspeed_stage_3_offload": (
        {"stage": 3, "offload_optimizer": True, "offload_parameters": True},
        "DeepSpeed ZeRO stage 3 with parameters and optimizer state offloaded to CPU memory.",
    ),
    "deepspeed_stage_3_offload_nvme": (
        _OFFLOAD_EVERYTHING_TO_NVME,
        "DeepSpeed ZeRO stage 3 with parameters and optimizer state offloaded to NVMe (needs libaio; set nvme_path).",
    ),
}


def register_strategies(registry: Registry) -> None:
    """Entry point of ``stratagem.strategies``."""
    for name, (defaults, description) in STRATEGY_ALIASES.items():
        registry.register(name, STRATEGY_TARGET, description=description, requires=REQUIREMENT, defaults=defaults)


def register_checkpoint_io(registry: Registry) -> None:
    """Entry point of ``stratagem.checkpoint_io``."""
    registry.register(
        "deepspeed",
        CHECKPOINT_IO_TARGET,
        description="DeepSpeed checkpoint directories; gathers full fp32 weights from ZeRO shards for any strategy.",
        requires=REQUIREMENT,
    )
