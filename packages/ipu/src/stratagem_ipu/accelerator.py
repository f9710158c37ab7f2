"""The IPU accelerator: Graphcore IPUs, found through PopTorch only when asked (never at import)."""

from __future__ import annotations

import importlib
import importlib.util

import torch

from stratagem.accelerators import Accelerator

_IPU_COUNTS = (64, 32, 16, 8, 4, 2, 1)
"""IPUs come in powers of two per machine; PopTorch answers "are n available?", not "how many?"."""

POPTORCH_MISSING = (
    "PopTorch is not installed: it ships with Graphcore's Poplar SDK (install the SDK's poptorch wheel "
    "and source the SDK's enable script); it is not on PyPI"
)


def poptorch_installed() -> bool:
    return importlib.util.find_spec("poptorch") is not None


class IPUAccelerator(Accelerator):
    """Graphcore IPUs. The host process drives every IPU of a run: weights and data stay on the host
    (``torch.device("cpu")``) and PopTorch moves them; ``devices`` is the replication factor."""

    device_type = "ipu"

    @staticmethod
    def is_available() -> bool:
        return IPUAccelerator.device_count() > 0

    @staticmethod
    def device_count() -> int:
        if not poptorch_installed():
            return 0
        poptorch = importlib.import_module("poptorch")
        return next((count for count in _IPU_COUNTS if poptorch.ipuHardwareIsAvailable(count)), 0)

    @staticmethod
    def unavailable_reason() -> str:
        if not poptorch_installed():
            return POPTORCH_MISSING
        return "PopTorch is installed but poptorch.ipuHardwareIsAvailable() found no IPU on this machine"

    def supports_autocast(self, dtype: torch.dtype) -> bool:
        # The step is traced on the host, where CPU autocast to fp16 records the casts into the executable.
        return dtype == torch.float16

    def needs_grad_scaler(self, dtype: torch.dtype) -> bool:
        # Loss scaling is the compiled optimizer's (PopTorch's loss_scaling), not torch's GradScaler.
        return False
