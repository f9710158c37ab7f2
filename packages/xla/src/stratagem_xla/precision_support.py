"""Which precisions the XLA strategies train in."""

from __future__ import annotations

from stratagem.precision import Precision

SUPPORTED = ("32-true", "bf16-mixed", "bf16-true", "16-true")
"""fp32, bf16 autocast (torch.autocast on "xla"), and whole-model bf16 or fp16. XLA has no fp16 autocast
with a gradient scaler outside CUDA, and no fp64 on TPUs."""


def check_precision(precision: Precision, strategy: str) -> None:
    """Raise ``ValueError`` naming ``precision`` and what the XLA strategy ``strategy`` accepts."""
    if precision.name not in SUPPORTED:
        raise ValueError(
            f"precision={precision.name!r} is not supported by strategy={strategy!r}; XLA trains in "
            f"{', '.join(repr(name) for name in SUPPORTED)}."
        )
