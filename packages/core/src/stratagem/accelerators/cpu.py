from __future__ import annotations

import os

import torch

from stratagem.accelerators.accelerator import Accelerator


class CPUAccelerator(Accelerator):
    """The CPU. ``devices=N`` means N processes, each using the CPU."""

    device_type = "cpu"
    process_group_backend = "gloo"

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def device_count() -> int:
        return os.cpu_count() or 1

    @staticmethod
    def unavailable_reason() -> str:
        return ""

    def auto_device_count(self) -> int:
        # One process: several CPU processes only help when the user asks for them.
        return 1

    def get_device(self, index: int) -> torch.device:
        return torch.device("cpu")
