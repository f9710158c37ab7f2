from __future__ import annotations

import sys
from typing import Any

import torch
from torch.optim import Optimizer

from stratagem.strategies import SingleDeviceStrategy


class StepCountingStrategy(SingleDeviceStrategy):
    """The built-in single-device strategy, plus a count of the optimizer steps it was asked to make.

    The count is :attr:`optimizer_steps`; with ``announce=True`` (the default) it is also
    printed to stderr at teardown.
    """

    def __init__(self, device: torch.device | str | int | None = None, announce: bool = True) -> None:
        super().__init__(device=device)
        self.announce = announce
        self.optimizer_steps = 0

    def optimizer_step(self, optimizer: Optimizer) -> Any:
        result = super().optimizer_step(optimizer)
        self.optimizer_steps += 1
        return result

    def teardown(self) -> None:
        super().teardown()
        if self.announce:
            print(f"example_single_device: {self.optimizer_steps} optimizer step(s)", file=sys.stderr)

    def __repr__(self) -> str:
        return f"StepCountingStrategy(device={str(self.root_device)!r}, optimizer_steps={self.optimizer_steps})"
