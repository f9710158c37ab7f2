"""The XLA accelerator (``accelerator="xla"``, alias ``"tpu"``): TPUs, or any PJRT device, through torch_xla."""

from __future__ import annotations

from typing import Any

import torch

from stratagem.accelerators import Accelerator
from stratagem_xla import runtime


class XLAAccelerator(Accelerator):
    """XLA devices through torch_xla's PJRT runtime. ``devices=N`` means N XLA devices (one process each, with
    the ``xla`` strategy).

    Counted as available only where this machine asks for XLA (a TPU is attached, or ``PJRT_DEVICE`` is set;
    ``PJRT_DEVICE=CPU`` runs XLA on the CPU): so ``accelerator="auto"`` picks it there and nowhere else. The
    ``single_xla``/``xla`` strategies bring this accelerator with them and so run on XLA's own default device
    (the CPU, where there is no TPU) without it being set.
    """

    device_type = "xla"
    process_group_backend = "xla"

    @staticmethod
    def is_available() -> bool:
        return runtime.xla_problem() is None and runtime.device_configured() and runtime.load_problem() is None

    @staticmethod
    def device_count() -> int:
        return runtime.device_count()

    @staticmethod
    def unavailable_reason() -> str:
        problem = runtime.xla_problem()
        if problem is None and not runtime.device_configured():
            return (
                "no XLA device is configured: no TPU is attached and PJRT_DEVICE is not set (PJRT_DEVICE=CPU runs "
                "XLA on the CPU)"
            )
        return problem or runtime.load_problem() or ""

    def get_device(self, index: int) -> torch.device:
        return torch.device("xla", index)

    def supports_autocast(self, dtype: torch.dtype) -> bool:
        # torch_xla's autocast covers bf16; fp16 autocast exists only for XLA on CUDA, which is not supported here.
        return dtype == torch.bfloat16

    def needs_grad_scaler(self, dtype: torch.dtype) -> bool:
        return False

    def get_device_stats(self, device: torch.device | None = None) -> dict[str, Any]:
        """The runtime's figures for ``device`` (this process's device by default): its type, and memory in
        bytes where the PJRT plugin reports it (TPUs and GPUs do; the CPU plugin does not, so there are none)."""
        runtime.require_xla()
        import torch_xla
        import torch_xla.core.xla_model as xm
        import torch_xla.runtime as xr

        stats: dict[str, Any] = {"device_type": xr.device_type()}
        try:
            info = xm.get_memory_info(device or torch_xla.device())
        except RuntimeError:  # "GetAllocatorStats is not supported" on plugins without memory statistics
            return stats
        stats.update(bytes_used=int(info["bytes_used"]), bytes_limit=int(info["bytes_limit"]))
        return stats
