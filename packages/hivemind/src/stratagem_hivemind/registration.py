"""The names this package registers. Imports nothing heavy: the target is a ``"module:Class"`` string."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stratagem.registry import Registry

REQUIREMENT = "hivemind>=1.1.12"
STRATEGY_TARGET = "stratagem_hivemind.strategy:HivemindStrategy"


def register(registry: Registry) -> None:
    """Entry point of ``stratagem.strategies``."""
    registry.register(
        "hivemind",
        STRATEGY_TARGET,
        description="One peer of a hivemind swarm: peers on any machines join and leave; gradients averaged per "
        "target_batch_size.",
        requires=REQUIREMENT,
    )
