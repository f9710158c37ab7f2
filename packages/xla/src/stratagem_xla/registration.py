"""What stratagem-xla registers; named by its entry points and kept free of heavy imports (torch_xla is
imported only when one of these names is used, never to list them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from stratagem_xla.runtime import INSTALL, XLA_REQUIREMENT

if TYPE_CHECKING:
    from stratagem.registry import Registry

# torch-xla's wheel declares no torch, so `pip install torch-xla==2.9.0` alone lands it beside any torch,
# where it cannot load: listings give runtime's command, which names the torch it loads against.
_REQUIRES = XLA_REQUIREMENT
_INSTALL = INSTALL


def register_strategies(registry: Registry) -> None:
    for name, target, defaults, description in (
        (
            "single_xla",
            "stratagem_xla.strategy:SingleXLAStrategy",
            {},
            "One process on one XLA device (a TPU core; XLA's CPU device where there is no TPU).",
        ),
        (
            "xla",
            "stratagem_xla.parallel:XLAStrategy",
            {},
            "One process per XLA device of the host (xmp.spawn), gradients all-reduced at each optimizer step.",
        ),
        (
            "xla_debug",
            "stratagem_xla.parallel:XLAStrategy",
            {"debug": True},
            "xla, printing XLA's metrics report (compilations, transfers, CPU fallbacks) when the run ends.",
        ),
        (
            "xla_fsdp",
            "stratagem_xla.fsdp:XLAFSDPStrategy",
            {},
            "XlaFullyShardedDataParallel, one replica per XLA device: parameters, gradients, optimizer state sharded.",
        ),
        (
            "xla_fsdp_v2",
            "stratagem_xla.spmd:XLAFSDPv2Strategy",
            {},
            "One process shards its model over every XLA device with SPMD (SpmdFullyShardedDataParallel).",
        ),
    ):
        registry.register(
            name, target, description=description, requires=_REQUIRES, install=_INSTALL, defaults=defaults
        )


def register_accelerators(registry: Registry) -> None:
    for name, description in (
        ("xla", "XLA devices through torch_xla (TPUs; PJRT_DEVICE=CPU runs XLA on the CPU)."),
        ("tpu", "Alias of 'xla': Google TPUs through torch_xla."),
    ):
        registry.register(
            name,
            "stratagem_xla.accelerator:XLAAccelerator",
            description=description,
            requires=_REQUIRES,
            install=_INSTALL,
        )


def register_checkpoint_io(registry: Registry) -> None:
    registry.register(
        "xla",
        "stratagem_xla.checkpoint_io:XLACheckpointIO",
        description="One torch.save file with every XLA tensor moved to the CPU first (xm.save), loadable anywhere.",
    )
    registry.register(
        "xla_sharded",
        "stratagem_xla.checkpoint_io:XLAShardedCheckpointIO",
        description="xla_fsdp's directories of per-rank shards, read by any strategy as whole weights.",
    )


def register_environments(registry: Registry) -> None:
    registry.register(
        "xla",
        "stratagem_xla.environment:XLAEnvironment",
        description="Replicas started by xmp.spawn or on a TPU VM: ordinals and world size from the XLA runtime.",
        requires=_REQUIRES,
        install=_INSTALL,
    )
