"""How HorovodStrategy's options are checked, without importing horovod."""

from __future__ import annotations

import importlib.util
from typing import Any

COMPRESSIONS = ("none", "fp16")
"""``compression=`` values: horovod's ``hvd.Compression.none`` and ``hvd.Compression.fp16``."""


def check_compression(compression: Any) -> str:
    if compression not in COMPRESSIONS:
        raise ValueError(
            f"HorovodStrategy(compression={compression!r}) is not valid; expected one of "
            f"{', '.join(map(repr, COMPRESSIONS))} (how gradients travel in the all-reduce)."
        )
    return str(compression)


def check_predivide_factor(factor: Any) -> float:
    if isinstance(factor, bool) or not isinstance(factor, int | float):
        raise TypeError(f"HorovodStrategy(gradient_predivide_factor={factor!r}) is not valid; expected a number.")
    if not factor > 0:
        raise ValueError(
            f"HorovodStrategy(gradient_predivide_factor={factor!r}) is not valid; expected a positive number "
            "(gradients are divided by it before the sum and by world_size / it after)."
        )
    return float(factor)


def check_gloo_iface(iface: Any) -> str | None:
    if iface is not None and (not isinstance(iface, str) or not iface):
        raise TypeError(
            f"HorovodStrategy(gloo_iface={iface!r}) is not valid; expected a network interface name such as 'eth0', "
            "or None ('lo' on one node, HOROVOD_GLOO_IFACE on several)."
        )
    return iface


def check_horovod_installed() -> None:
    """Raise an ImportError saying how to build horovod when it is not installed (without importing it)."""
    # Not a registry requirement: its hint would be `pip install horovod`, which fails to compile against
    # torch >= 2.1.
    if importlib.util.find_spec("horovod") is None:
        raise ImportError(
            "HorovodStrategy needs horovod, which is not installed. horovod 0.28.1 does not compile against "
            "torch >= 2.1 as published: build it with `python tools/build_horovod.py` from the stratagem "
            "repository (see stratagem-horovod's README)."
        )
