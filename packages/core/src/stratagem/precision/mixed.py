from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from stratagem.precision.precision import Precision

if TYPE_CHECKING:
    from torch.optim import Optimizer

    from stratagem.accelerators import Accelerator


class MixedPrecision(Precision):
    """fp32 parameters with autocast to ``dtype`` (``"16-mixed"``, ``"bf16-mixed"``).

    fp16 gets a gradient scaler where the device needs one; the scaler's state is part of
    the checkpoint. With several optimizers stepped after one backward, the scale must stay
    the same until all of them have unscaled their gradients: it is updated once, before
    the next loss is scaled (or when its state is read).
    """

    exact = False

    def __init__(self, dtype: str | torch.dtype = "bfloat16") -> None:
        resolved = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        if resolved not in (torch.float16, torch.bfloat16):
            raise ValueError(f"MixedPrecision(dtype={dtype!r}) must be float16 or bfloat16.")
        self.dtype = resolved
        self.name = "16-mixed" if resolved == torch.float16 else "bf16-mixed"  # type: ignore[misc]
        self._device_type = "cpu"
        self.scaler: torch.amp.GradScaler | None = None
        self._update_pending = False

    def check_accelerator(self, accelerator: Accelerator) -> None:
        if not accelerator.supports_autocast(self.dtype):
            alternatives = [
                name
                for name, dtype in (("bf16-mixed", torch.bfloat16), ("16-mixed", torch.float16))
                if dtype != self.dtype and accelerator.supports_autocast(dtype)
            ]
            instead = " or ".join(repr(n) for n in [*alternatives, "32-true"])
            raise ValueError(
                f"precision={self.name!r} needs {self.dtype} autocast, which {accelerator.device_type!r} does not "
                f"support here; use {instead}."
            )
        self._device_type = accelerator.device_type
        if accelerator.needs_grad_scaler(self.dtype):
            self.scaler = torch.amp.GradScaler(accelerator.device_type)

    @property
    def skips_nonfinite_gradients(self) -> bool:
        return self.scaler is not None and self.scaler.is_enabled()

    def forward_context(self) -> contextlib.AbstractContextManager[Any]:
        return torch.autocast(self._device_type, dtype=self.dtype)

    def convert_output(self, data: Any) -> Any:
        # Losses and reductions run in fp32 under autocast; outside it they would run in the outputs' dtype.
        from torch.utils._pytree import tree_map

        def to_float32(value: Any) -> Any:
            if isinstance(value, torch.Tensor) and value.dtype == self.dtype:
                return value.float()
            return value

        return tree_map(to_float32, data)

    def backward(self, loss: torch.Tensor, backward: Callable[[torch.Tensor], None]) -> None:
        if self.scaler is None:
            backward(loss)
            return
        self._apply_pending_update()
        backward(self.scaler.scale(loss))

    def unscale_gradients(self, optimizer: Optimizer) -> None:
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def optimizer_step(self, optimizer: Optimizer, step: Callable[[], Any]) -> Any:
        if self.scaler is None:
            return step()
        result = self.scaler.step(optimizer)
        self._update_pending = True
        return result

    def state_dict(self) -> dict[str, Any]:
        if self.scaler is None:
            return {}
        self._apply_pending_update()
        return {"scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.scaler is not None and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
            self._update_pending = False

    def _apply_pending_update(self) -> None:
        if self._update_pending and self.scaler is not None:
            self.scaler.update()
            self._update_pending = False
