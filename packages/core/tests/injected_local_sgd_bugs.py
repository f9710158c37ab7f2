"""Three bugs injected into the example local-SGD strategy (examples/local_sgd), registered as strategies.

The conformance kit must fail each of them: tests/test_conformance_catches_injected_bugs.py runs it.
The subprocesses the kit starts find them through a dist-info written by that test.
"""

from __future__ import annotations

from typing import Any

from stratagem_local_sgd.strategy import LocalSGDStrategy
from torch import nn

from stratagem.checkpoint_io import PathLike
from stratagem.registry import Registry
from stratagem.strategies import Strategy


class NeverAverages(LocalSGDStrategy):
    """Bug 1: parameters are never averaged during training (the whole-state view and checkpoints still average)."""

    def average_parameters(self) -> None:
        self.steps_since_average = 0


class SkipsInitialBroadcast(LocalSGDStrategy):
    """Bug 2: rank 0's initial weights are never broadcast; each rank starts from what it built."""

    def setup_module(self, module: nn.Module) -> nn.Module:
        module = Strategy.setup_module(self, module)
        self.steps_since_average = 0
        return module


class SavesRankZeroLocalState(LocalSGDStrategy):
    """Bug 3: a checkpoint holds only rank 0's local state (the base Strategy's save_checkpoint)."""

    def save_checkpoint(self, path: PathLike, state: dict[str, Any]) -> None:
        Strategy.save_checkpoint(self, path, state)


BUGS = {
    "local_sgd_bug_never_averages": "NeverAverages",
    "local_sgd_bug_no_initial_broadcast": "SkipsInitialBroadcast",
    "local_sgd_bug_rank_zero_checkpoint": "SavesRankZeroLocalState",
}


def register(registry: Registry) -> None:
    for name, target in BUGS.items():
        registry.register(
            name, f"injected_local_sgd_bugs:{target}", description="injected bug", defaults={"average_every": 4}
        )
