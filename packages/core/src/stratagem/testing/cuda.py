"""Marking tests that need NVIDIA GPUs: run together with ``pytest -m cuda`` (``tools/gpu_check.sh``), skipped
elsewhere saying what is missing."""

from __future__ import annotations

from typing import Any


def cuda_device_count() -> int:
    """How many CUDA GPUs this process sees (0 without a CUDA build of torch or a driver)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def requires_cuda(devices: int = 1) -> list[Any]:
    """The marks of a test that needs ``devices`` CUDA GPUs: ``cuda``, and a skip naming what this machine lacks.
    Use as ``pytestmark = requires_cuda()`` or ``@pytest.mark.parametrize(..., marks=requires_cuda(2))``."""
    import pytest

    from stratagem.accelerators.cuda import CUDAAccelerator

    available = cuda_device_count()
    why = f"; {CUDAAccelerator.unavailable_reason()}" if available == 0 else ""
    reason = (
        f"needs {devices} CUDA GPU{'s' if devices != 1 else ''}, this machine has {available}{why}; "
        "tools/gpu_check.sh runs the cuda-marked tests where there are"
    )
    return [pytest.mark.cuda, pytest.mark.skipif(available < devices, reason=reason)]
