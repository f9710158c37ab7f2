"""The names stratagem-ddp registers. Imports nothing heavy: targets load when chosen."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stratagem.registry import Registry

_DDP = "stratagem_ddp.strategy:DDPStrategy"
_FIND_UNUSED = "_find_unused_parameters_true"
_NO_FIND_UNUSED = "_find_unused_parameters_false"

_DDP_VARIANTS = (
    ("ddp", "popen", "One process per device; re-runs your command per rank, or joins torchrun/SLURM/MPI ranks."),
    ("ddp_spawn", "spawn", "ddp with ranks started by multiprocessing's spawn; results come back to the caller."),
    ("ddp_fork", "fork", "ddp with ranks forked from the calling process; results come back to the caller."),
    ("ddp_notebook", "fork", "ddp_fork for Jupyter and other interactive sessions."),
)


def register(registry: Registry) -> None:
    """Entry point of the ``stratagem.strategies`` group."""
    for name, start_method, description in _DDP_VARIANTS:
        registry.register(name, _DDP, description=description, defaults={"start_method": start_method})
        registry.register(
            name + _FIND_UNUSED,
            _DDP,
            description=f"{name} with find_unused_parameters=True (modules whose forward skips parameters).",
            defaults={"start_method": start_method, "find_unused_parameters": True},
        )
        # Lightning 2.x still registers these; find_unused_parameters=False is the default here too.
        registry.register(
            name + _NO_FIND_UNUSED,
            _DDP,
            description=f"{name} with find_unused_parameters=False (the default; Lightning's name).",
            defaults={"start_method": start_method, "find_unused_parameters": False},
        )
    registry.register(
        "dp",
        "stratagem_ddp.dp:DataParallelStrategy",
        description="torch DataParallel: one process driving several CUDA GPUs (32/64-bit precision only).",
    )
