from __future__ import annotations

import platform

import torch

from stratagem.accelerators.accelerator import Accelerator


class MPSAccelerator(Accelerator):
    """Apple silicon GPUs through ``torch.backends.mps``. One device, one process."""

    device_type = "mps"

    @staticmethod
    def is_available() -> bool:
        return torch.backends.mps.is_available()

    @staticmethod
    def device_count() -> int:
        return 1 if torch.backends.mps.is_available() else 0

    @staticmethod
    def unavailable_reason() -> str:
        if platform.system() != "Darwin":
            return f"MPS needs macOS on Apple silicon; this is {platform.system()}"
        return "torch.backends.mps.is_available() is false (torch built without MPS, or macOS < 12.3)"

    def get_device(self, index: int) -> torch.device:
        return torch.device("mps", 0)
