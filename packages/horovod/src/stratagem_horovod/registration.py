"""The names stratagem-horovod registers. Imports nothing heavy: the target loads when chosen."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stratagem.registry import Registry


def register_strategies(registry: Registry) -> None:
    """Entry point of the ``stratagem.strategies`` group."""
    registry.register(
        "horovod",
        "stratagem_horovod.strategy:HorovodStrategy",
        description="Horovod: one process per device, gradients averaged by hvd.DistributedOptimizer over Gloo.",
    )


def register_environments(registry: Registry) -> None:
    """Entry point of the ``stratagem.environments`` group."""
    registry.register(
        "horovodrun",
        "stratagem_horovod.environment:HorovodrunEnvironment",
        description="Ranks started by horovodrun --gloo (HOROVOD_RANK, HOROVOD_SIZE, ...); MASTER_ADDR/PORT as MPI.",
    )
