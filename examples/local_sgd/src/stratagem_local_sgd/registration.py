"""What the ``stratagem.strategies`` entry point calls: light, it imports nothing heavy."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stratagem.registry import Registry


def register(registry: Registry) -> None:
    registry.register(
        "local_sgd",
        "stratagem_local_sgd.strategy:LocalSGDStrategy",
        description="Ranks step alone on their data and average parameters every K steps (average_every, 4).",
        requires="torch>=2.4",
        defaults={"average_every": 4},
    )
