"""The precisions an IPU run takes: ``32-true``, ``16-true``, and ``16-mixed`` traced under fp16 autocast."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from stratagem.precision import Precision

SUPPORTED = ("32-true", "16-true", "16-mixed")


class IPUMixedPrecision(Precision):
    """fp32 weights, the step traced under CPU fp16 autocast so that the executable computes in fp16.

    No gradient scaler: loss scaling belongs to the compiled optimizer (PopTorch's ``loss_scaling``).
    """

    name = "16-mixed"
    exact = False

    def forward_context(self) -> contextlib.AbstractContextManager[Any]:
        return torch.autocast("cpu", dtype=torch.float16)
