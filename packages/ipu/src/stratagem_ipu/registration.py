"""What stratagem-ipu registers; named by its entry points and kept free of heavy imports (no poptorch)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stratagem.registry import Registry

REQUIRES = "poptorch>=3.0"
"""PopTorch ships with Graphcore's Poplar SDK (a wheel in the SDK), not on PyPI."""

INSTALL = (
    "install the poptorch wheel that comes with Graphcore's Poplar SDK (https://docs.graphcore.ai); it is not on PyPI"
)


def register_strategies(registry: Registry) -> None:
    registry.register(
        "ipu_strategy",
        "stratagem_ipu.strategy:IPUStrategy",
        description=(
            "Graphcore IPUs through PopTorch: training compiled with forward, backward and optimizer step "
            "(poptorch.trainingModel), evaluation through poptorch.inferenceModel. PopTorch comes with Graphcore's "
            "Poplar SDK, not from PyPI."
        ),
        requires=REQUIRES,
        install=INSTALL,
    )


def register_accelerators(registry: Registry) -> None:
    registry.register(
        "ipu",
        "stratagem_ipu.accelerator:IPUAccelerator",
        description="Graphcore IPUs, reached through PopTorch (which comes with the Poplar SDK, not from PyPI).",
        requires=REQUIRES,
        install=INSTALL,
    )
