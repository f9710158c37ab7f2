from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from stratagem.precision.precision import Precision

if TYPE_CHECKING:
    from torch.optim import Optimizer

    from stratagem.accelerators import Accelerator

_NAMES = {torch.float64: "64-true", torch.float16: "16-true", torch.bfloat16: "bf16-true", torch.float32: "32-true"}


class TruePrecision(Precision):
    """Parameters, inputs and compute all in one dtype (``"64-true"``, ``"16-true"``, ``"bf16-true"``)."""

    def __init__(self, dtype: str | torch.dtype = "float32") -> None:
        self.param_dtype = _to_dtype(dtype)
        self.name = _NAMES[self.param_dtype]  # type: ignore[misc]
        self.exact = self.param_dtype in (torch.float32, torch.float64)

    def check_accelerator(self, accelerator: Accelerator) -> None:
        if self.param_dtype == torch.float64 and accelerator.device_type == "mps":
            raise ValueError("precision='64-true' is not supported on MPS (no float64); use '32-true'.")

    def check_optimizer(self, optimizer: Optimizer) -> None:
        # Optimizer state lives in the parameters' dtype: an epsilon that rounds to zero there turns
        # Adam's first near-zero second moment into a division by zero (nan from the second step).
        for index, group in enumerate(optimizer.param_groups):
            eps = group.get("eps")
            if isinstance(eps, (int, float)) and eps > 0 and torch.tensor(eps, dtype=self.param_dtype).item() == 0:
                smallest = torch.finfo(self.param_dtype).tiny
                raise ValueError(
                    f"precision={self.name!r} keeps {type(optimizer).__name__}'s state in {self.param_dtype}, where "
                    f"its eps={eps:g} (param group {index}) rounds to 0, so training turns to nan. Pass eps >= "
                    f"{smallest:.1e} (e.g. eps=1e-4) to the optimizer, or use precision='16-mixed' or 'bf16-true'."
                )

    def convert_input(self, data: Any) -> Any:
        from torch.utils._pytree import tree_map

        dtype = self.param_dtype

        def cast(value: Any) -> Any:
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                return value.to(dtype)
            return value

        return tree_map(cast, data)


def _to_dtype(dtype: str | torch.dtype) -> torch.dtype:
    resolved = dtype if isinstance(dtype, torch.dtype) else getattr(torch, dtype, None)
    if resolved not in _NAMES:
        raise ValueError(
            f"dtype={dtype!r} is not a supported parameter dtype; use one of float32, float64, float16, bfloat16."
        )
    return resolved
