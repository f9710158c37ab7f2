"""HPUAccelerator: Intel Gaudi cards through Habana's PyTorch bridge."""

from __future__ import annotations

from typing import Any

import torch

from stratagem.accelerators import Accelerator
from stratagem_hpu import availability, habana
from stratagem_hpu.device import tensor_device


class HPUAccelerator(Accelerator):
    """Gaudi cards, one per process, joined by HCCL.

    Available means Habana's software is installed (nothing is probed before a run asks for cards);
    ``devices=N`` is checked against the cards the bridge reports when a run is resolved.
    """

    device_type = "hpu"
    process_group_backend = "hccl"

    @staticmethod
    def is_available() -> bool:
        return availability.habana_problem() is None

    @staticmethod
    def device_count() -> int:
        if availability.habana_problem() is not None:
            return 0
        return int(habana.hpu().device_count())

    @staticmethod
    def unavailable_reason() -> str:
        return availability.habana_problem() or "Habana's software is installed"

    def get_device(self, index: int) -> torch.device:
        return tensor_device()

    @staticmethod
    def device_name() -> str:
        """The card's name as Habana reports it, e.g. ``"GAUDI2"``."""
        return str(habana.hpu().get_device_name())

    @staticmethod
    def memory_stats(device: torch.device | None = None) -> dict[str, Any]:
        """Habana's memory statistics of the card (``Limit``, ``InUse``, ``MaxInUse``, ``NumAllocs`` ...)."""
        return dict(habana.hpu().memory_stats(device))
