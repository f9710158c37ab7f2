"""The names stratagem-colossalai registers. Imports nothing heavy: the target loads when chosen."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stratagem.registry import Registry


def register(registry: Registry) -> None:
    """Entry point of the ``stratagem.strategies`` group."""
    registry.register(
        "colossalai",
        "stratagem_colossalai.strategy:ColossalAIStrategy",
        description="Colossal-AI's Booster with its DDP plugin, one process per device (sharded plugins: refused).",
    )
