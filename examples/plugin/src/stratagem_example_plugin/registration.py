"""What the ``stratagem.strategies`` entry point calls.

Kept light on purpose: stratagem calls it while listing every strategy, so it imports nothing
and names its strategy by a ``"module:Class"`` string that is imported only when the user
chooses ``strategy="example_single_device"``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stratagem.registry import Registry


def register(registry: Registry) -> None:
    registry.register(
        "example_single_device",
        "stratagem_example_plugin.strategy:StepCountingStrategy",
        description="One device, counting optimizer steps and reporting them at teardown (example plugin).",
        requires="torch>=2.4",
    )
