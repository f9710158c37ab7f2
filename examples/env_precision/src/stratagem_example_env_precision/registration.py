"""What the entry points call. Light: the classes are named by strings and imported only when used."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stratagem.registry import Registry


def register_environments(registry: Registry) -> None:
    registry.register(
        "example_scheduler",
        "stratagem_example_env_precision.environment:ExampleSchedulerEnvironment",
        description="Ranks started by the (imaginary) example scheduler, which sets EXAMPLE_SCHEDULER_* variables.",
    )


def register_precisions(registry: Registry) -> None:
    registry.register(
        "32-finite",
        "stratagem_example_env_precision.precision:FiniteLossPrecision",
        description="fp32, and a clear error at the first step whose loss is not finite.",
    )
