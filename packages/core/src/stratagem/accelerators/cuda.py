from __future__ import annotations

import torch

from stratagem.accelerators.accelerator import Accelerator


class CUDAAccelerator(Accelerator):
    """NVIDIA (or ROCm) GPUs through ``torch.cuda``."""

    device_type = "cuda"
    process_group_backend = "nccl"

    @staticmethod
    def is_available() -> bool:
        return torch.cuda.is_available()

    @staticmethod
    def device_count() -> int:
        return torch.cuda.device_count()

    @staticmethod
    def unavailable_reason() -> str:
        if torch.version.cuda is None and torch.version.hip is None:
            return f"torch {torch.__version__} is a CPU-only build"
        return "no CUDA device is visible (check CUDA_VISIBLE_DEVICES and the driver)"

    def setup_device(self, device: torch.device) -> None:
        torch.cuda.set_device(device)

    def teardown(self) -> None:
        torch.cuda.empty_cache()

    def reset_peak_memory(self, device: torch.device) -> None:
        torch.cuda.reset_peak_memory_stats(device)

    def peak_memory_bytes(self, device: torch.device) -> int | None:
        # The caching allocator's peak of memory held by tensors (not what it reserved beside them).
        return int(torch.cuda.max_memory_allocated(device))

    def synchronize(self, device: torch.device) -> None:
        torch.cuda.synchronize(device)
