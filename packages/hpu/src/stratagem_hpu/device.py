"""The torch device an HPU process computes on."""

from __future__ import annotations

import torch

from stratagem_hpu import habana


def tensor_device() -> torch.device:
    """``torch.device("hpu")``: each process drives one card, chosen by Habana's bridge from its local rank.

    The one substitution for the tests: torch cannot make ``hpu`` tensors without Habana's bridge, so the
    test stand-in of ``habana_frameworks.torch.hpu`` declares ``TENSOR_DEVICE_TYPE = "cpu"`` (not part of
    Habana's API) and its cards compute on the CPU. This is the only place that reads it.
    """
    return torch.device(getattr(habana.hpu(), "TENSOR_DEVICE_TYPE", "hpu"))
