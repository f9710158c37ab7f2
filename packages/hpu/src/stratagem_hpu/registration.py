"""The names stratagem-hpu registers. Imports nothing heavy: targets are ``"module:Class"`` strings, and whether
Habana's software is here is asked only when a name is described or used."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stratagem.registry import Registry

_PARALLEL = "stratagem_hpu.strategy:HPUParallelStrategy"


def register_strategies(registry: Registry) -> None:
    """Entry point of ``stratagem.strategies``."""
    registry.register(
        "hpu_single",
        "stratagem_hpu.strategy:HPUSingleStrategy",
        description="One Intel Gaudi card; lazy mode with mark_step at step boundaries, eager or torch.compile.",
    )
    registry.register(
        "hpu_parallel",
        _PARALLEL,
        description="One process per Gaudi card, DDP over HCCL (lightning-habana's hpu_parallel).",
    )
    registry.register(
        "hpu_ddp", _PARALLEL, description="hpu_parallel under lightning-habana's newer name: DDP over HCCL."
    )


def register_accelerators(registry: Registry) -> None:
    """Entry point of ``stratagem.accelerators``."""
    registry.register(
        "hpu",
        "stratagem_hpu.accelerator:HPUAccelerator",
        description="Intel Gaudi cards through Habana's PyTorch bridge (habana_frameworks).",
    )


def register_precisions(registry: Registry) -> None:
    """Entry point of ``stratagem.precisions``."""
    registry.register(
        "fp8",
        "stratagem_hpu.precision:HPUFP8Precision",
        description="fp8 on Gaudi2 and later through Habana's transformer engine (nn.Linear layers swapped).",
    )
