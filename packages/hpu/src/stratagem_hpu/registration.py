"""The names stratagem-hpu registers. Imports nothing heavy: targets are ``"module:Class"`` strings, and every name
declares Habana's bridge as its ``requires_module``, which the registry finds on the import path without importing
it, so even a plain ``stratagem strategies`` says when it is missing."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from stratagem_hpu.availability import HABANA_INSTALL, HABANA_MODULE

if TYPE_CHECKING:
    from stratagem.registry import Registry


_PARALLEL = "stratagem_hpu.strategy:HPUParallelStrategy"
_FSDP_REQUIREMENT = "stratagem-fsdp>=0.1,<0.2"
_DEEPSPEED_REQUIREMENT = "stratagem-deepspeed>=0.1,<0.2"
_DEEPSPEED = "stratagem_hpu.deepspeed:HPUDeepSpeedStrategy"


def register_strategies(registry: Registry) -> None:
    """Entry point of ``stratagem.strategies``."""
    registry.register(
        "hpu_single",
        "stratagem_hpu.strategy:HPUSingleStrategy",
        description="One Intel Gaudi card; lazy mode with mark_step at step boundaries, eager or torch.compile.",
        requires_module=HABANA_MODULE,
        install=HABANA_INSTALL,
    )
    registry.register(
        "hpu_parallel",
        _PARALLEL,
        description="One process per Gaudi card, DDP over HCCL (lightning-habana's hpu_parallel).",
        requires_module=HABANA_MODULE,
        install=HABANA_INSTALL,
    )
    registry.register(
        "hpu_ddp",
        _PARALLEL,
        description="hpu_parallel under lightning-habana's newer name: DDP over HCCL.",
        requires_module=HABANA_MODULE,
        install=HABANA_INSTALL,
    )
    registry.register(
        "hpu_fsdp",
        "stratagem_hpu.fsdp:HPUFSDPStrategy",
        description="stratagem-fsdp's fsdp on Gaudi cards over HCCL, with HPU lazy mode.",
        requires=_FSDP_REQUIREMENT,
        requires_module=HABANA_MODULE,
        install=HABANA_INSTALL,
    )
    for name, defaults, description in _deepspeed_variants():
        registry.register(
            name,
            _DEEPSPEED,
            description=description,
            defaults=defaults,
            requires=_DEEPSPEED_REQUIREMENT,
            requires_module=HABANA_MODULE,
            install=HABANA_INSTALL,
        )


def _deepspeed_variants() -> list[tuple[str, dict[str, object], str]]:
    """``hpu_<name>`` for every DeepSpeed alias stratagem-deepspeed registers (read from its light registration
    module), or only ``hpu_deepspeed`` where it is not installed, listed unavailable with the install command."""
    if importlib.util.find_spec("stratagem_deepspeed") is None:
        return [("hpu_deepspeed", {}, "stratagem-deepspeed's deepspeed on Gaudi cards over HCCL.")]
    from stratagem_deepspeed.registration import STRATEGY_ALIASES

    return [
        (f"hpu_{name}", dict(defaults), f"On Gaudi cards over HCCL: {description}")
        for name, (defaults, description) in STRATEGY_ALIASES.items()
    ]


def register_accelerators(registry: Registry) -> None:
    """Entry point of ``stratagem.accelerators``."""
    registry.register(
        "hpu",
        "stratagem_hpu.accelerator:HPUAccelerator",
        description="Intel Gaudi cards through Habana's PyTorch bridge (habana_frameworks).",
        requires_module=HABANA_MODULE,
        install=HABANA_INSTALL,
    )


def register_precisions(registry: Registry) -> None:
    """Entry point of ``stratagem.precisions``."""
    registry.register(
        "fp8",
        "stratagem_hpu.precision:HPUFP8Precision",
        description="fp8 on Gaudi2 and later through Habana's transformer engine (nn.Linear layers swapped).",
        requires_module=HABANA_MODULE,
        install=HABANA_INSTALL,
    )
