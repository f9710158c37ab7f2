from __future__ import annotations

import os
import warnings

import torch

from stratagem.accelerators.accelerator import Accelerator
from stratagem.accelerators.host_memory import peak_resident_bytes, reset_peak_resident_memory

PROCESS_MEMORY = 200 * 2**20
"""What one CPU process needs at least, in bytes: Python with torch imported, before any model (measured: ~220 MiB)."""


class CPUAccelerator(Accelerator):
    """The CPU. ``devices=N`` means N processes, each using the CPU.

    More processes than usable cores is allowed, with a warning (they share the cores, which helps
    trying out a world size but not speed); more than the machine's memory can hold is refused.
    """

    device_type = "cpu"
    process_group_backend = "gloo"

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def device_count() -> int:
        return usable_cpu_count()

    @staticmethod
    def unavailable_reason() -> str:
        return ""

    def auto_device_count(self) -> int:
        # One process: several CPU processes only help when the user asks for them.
        return 1

    def reset_peak_memory(self, device: torch.device) -> None:
        reset_peak_resident_memory()

    def peak_memory_bytes(self, device: torch.device) -> int | None:
        return peak_resident_bytes()

    def get_device(self, index: int) -> torch.device:
        return torch.device("cpu")

    def parse_devices(self, devices: int | list[int] | str) -> list[torch.device]:
        parsed = super().parse_devices(devices)
        _check_process_count(len(parsed), devices)
        return parsed


def usable_cpu_count() -> int:
    """The cores this process may run on (its affinity where the OS tells it, else every core)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def _check_process_count(count: int, devices: object) -> None:
    memory = _physical_memory()
    if memory is not None and count * PROCESS_MEMORY > memory:
        raise ValueError(
            f"devices={devices!r} asks for {count} CPU processes, each needing at least "
            f"{PROCESS_MEMORY // 2**20} MiB (Python and torch), but this machine has {memory / 2**30:.1f} GiB of "
            f"memory: at most {memory // PROCESS_MEMORY} processes fit. Use a smaller devices= (this machine has "
            f"{usable_cpu_count()} usable CPU cores)."
        )
    cores = usable_cpu_count()
    if count > cores:
        warnings.warn(
            f"devices={devices!r} starts {count} CPU processes on {cores} usable CPU core(s): they share the cores, "
            f"so each step is slower than with devices={cores}. That is fine for trying out a world size.",
            stacklevel=4,
        )
