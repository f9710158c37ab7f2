"""An fp32 precision that stops at the first step whose loss is not finite."""

from __future__ import annotations

from collections.abc import Callable

import torch

from stratagem.precision import Precision


class FiniteLossPrecision(Precision):
    """Plain fp32 (so :attr:`~stratagem.precision.Precision.exact` stays ``True``: tools comparing runs hold
    it to fp32's tolerance), and a ``FloatingPointError`` instead of a silent NaN when the loss is not finite.
    """

    name = "32-finite"

    def backward(self, loss: torch.Tensor, backward: Callable[[torch.Tensor], None]) -> None:
        if not torch.isfinite(loss).all():
            raise FloatingPointError(f"precision='32-finite': the loss is {loss.item()}; stopping before backward.")
        backward(loss)
