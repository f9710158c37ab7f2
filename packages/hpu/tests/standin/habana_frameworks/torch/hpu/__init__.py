"""``habana_frameworks.torch.hpu``: device queries, memory statistics and HPU graphs."""

from __future__ import annotations

import os
from typing import Any

import torch

from habana_frameworks import record

TENSOR_DEVICE_TYPE = "cpu"
"""Not in Habana's API: torch cannot make ``hpu`` tensors without Habana's bridge, so the stand-in's cards
compute on the CPU. Read by ``stratagem_hpu.device.tensor_device`` and nowhere else."""

_current = 0


def is_available() -> bool:
    return device_count() > 0


def device_count() -> int:
    return int(os.environ.get("HABANA_STANDIN_DEVICES", "2"))


def get_device_name() -> str:
    return "GAUDI2"


def current_device() -> int:
    return _current


def set_device(device: int | str | torch.device) -> None:
    global _current
    record("set_device", device=str(device))
    _current = device if isinstance(device, int) else (torch.device(device).index or 0)


def synchronize() -> None:
    record("synchronize")


def memory_stats(device: Any = None) -> dict[str, int]:
    """Habana's keys with fixed values: a CPU has no card memory to report."""
    return {
        "Limit": 96 * 1024**3,
        "InUse": 0,
        "MaxInUse": 0,
        "NumAllocs": 0,
        "NumFrees": 0,
        "ActiveAllocs": 0,
        "MaxAllocSize": 0,
        "TotalSystemAllocs": 0,
        "TotalSystemFrees": 0,
        "TotalActiveAllocs": 0,
    }


def wrap_in_hpu_graph(module: torch.nn.Module, asynchronous: bool = False, disable_tensor_cache: bool = False) -> Any:
    """Habana records the module's forward once as an HPU graph and replays it; here the module is marked and
    returned (it runs eagerly)."""
    record("wrap_in_hpu_graph", module=type(module).__name__, asynchronous=asynchronous)
    module._hpu_graph_wrapped = True  # type: ignore[assignment]
    return module
