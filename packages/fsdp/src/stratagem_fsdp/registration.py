"""What stratagem-fsdp registers; named by its entry points and kept free of heavy imports."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stratagem.registry import Registry

_STRATEGY = "stratagem_fsdp.strategy:FSDPStrategy"
_REQUIRES = "torch>=2.9"


def register_strategies(registry: Registry) -> None:
    for name, defaults, description in (
        ("fsdp", {}, "Fully sharded data parallel (fully_shard): parameters, gradients and optimizer state sharded."),
        (
            "fsdp_cpu_offload",
            {"cpu_offload": True},
            "fsdp with shards and optimizer steps kept in CPU memory (cpu_offload=True).",
        ),
        ("fsdp_spawn", {"start_method": "spawn"}, "fsdp with ranks started by multiprocessing's spawn."),
        ("fsdp_fork", {"start_method": "fork"}, "fsdp with ranks forked from the calling process (notebooks)."),
    ):
        registry.register(name, _STRATEGY, description=description, requires=_REQUIRES, defaults=defaults)
    registry.register(
        "model_parallel",
        "stratagem_fsdp.model_parallel:ModelParallelStrategy",
        description="Tensor parallel (your plan on self.device_mesh['tp']) composed with fully_shard (and HSDP) on one "
        "device mesh: dp_replicate x dp_shard x tp.",
        requires=_REQUIRES,
    )
    registry.register(
        "pipeline",
        "stratagem_fsdp.pipeline:PipelineStrategy",
        description="Pipeline parallel: the model cut into stages over pp ranks, trained by a torch schedule (gpipe, "
        "1f1b, interleaved, zero bubble); each stage fully sharded over dp_shard. pp x dp_replicate x dp_shard.",
        requires=_REQUIRES,
    )
