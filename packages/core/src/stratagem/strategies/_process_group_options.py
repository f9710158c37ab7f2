"""Checking a parallel strategy's ``process_group_backend`` and ``timeout`` in the calling process, where a bad
value fails at once rather than once every rank has started and tries to join the group."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import torch.distributed as dist


def check_process_group_backend(backend: Any) -> str | None:
    """``backend`` in torch's spelling (``"nccl"``, or ``"cpu:gloo,cuda:nccl"``), or ``None`` when not given.

    It must be a backend torch knows (built in, or registered with ``torch.distributed.Backend.register_backend``)
    and one this build of torch provides.
    """
    if backend is None:
        return None
    if not isinstance(backend, str):
        raise TypeError(
            f"process_group_backend={backend!r} ({type(backend).__name__}) is not valid; expected None or a "
            f"torch.distributed backend name ({', '.join(_known_backends())})."
        )
    for _, name in _device_backend_pairs(backend):
        if name not in _known_backends():
            raise ValueError(
                f"process_group_backend={backend!r} is not valid: torch.distributed knows no backend {name!r}. "
                f"Known: {', '.join(_known_backends())}; a third-party backend must be registered "
                "(torch.distributed.Backend.register_backend) before the strategy is created."
            )
        if not dist.is_backend_available(name):
            available = [known for known in _known_backends() if dist.is_backend_available(known)]
            raise ValueError(
                f"process_group_backend={backend!r} is not valid here: this build of torch has no {name!r} backend "
                f"(torch.distributed.is_backend_available({name!r}) is False). Available here: "
                f"{', '.join(available) or '(none)'}."
            )
    return str(dist.Backend(backend))


def check_backend_fits_device(backend: str | None, device_type: str) -> None:
    """Refuse a backend given by the user that cannot move tensors of ``device_type``."""
    if backend is None:
        return
    pairs = _device_backend_pairs(backend)
    if any(device is not None for device, _ in pairs):
        names = [name for device, name in pairs if device == device_type]
        if not names:
            raise ValueError(
                f"process_group_backend={backend!r} names no backend for the accelerator's {device_type!r} "
                f"devices. Add '{device_type}:<backend>', or leave process_group_backend unset."
            )
    else:
        names = [name for _, name in pairs]
    default = dist.Backend.default_device_backend_map.get(device_type)
    for name in names:
        devices = dist.Backend.backend_capability.get(name)
        if devices is not None and device_type not in devices and name != default:
            default_note = f" ({default!r})" if default else ""
            raise ValueError(
                f"process_group_backend={backend!r} does not fit accelerator={device_type!r}: {name!r} moves "
                f"tensors of {', '.join(devices)} devices only. Leave process_group_backend unset for the "
                f"accelerator's default{default_note}."
            )


def check_timeout(timeout: Any) -> timedelta:
    """``timeout`` (a ``timedelta`` or a number of seconds) as a positive ``timedelta``."""
    accepted = "a positive number of seconds or a datetime.timedelta"
    if isinstance(timeout, timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, int | float) and not isinstance(timeout, bool):
        seconds = float(timeout)
    else:
        raise TypeError(f"timeout={timeout!r} ({type(timeout).__name__}) is not valid; expected {accepted}.")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"timeout={timeout!r} is not valid; expected {accepted}.")
    try:
        return timeout if isinstance(timeout, timedelta) else timedelta(seconds=seconds)
    except OverflowError:
        raise ValueError(f"timeout={timeout!r} is too large for a timedelta; expected {accepted}.") from None


def _known_backends() -> list[str]:
    return [name for name in dist.Backend.backend_list if name != dist.Backend.UNDEFINED]


def _device_backend_pairs(backend: str) -> list[tuple[str | None, str]]:
    """``"nccl"`` -> ``[(None, "nccl")]``; ``"cpu:gloo,cuda:nccl"`` -> ``[("cpu", "gloo"), ("cuda", "nccl")]``."""
    pairs: list[tuple[str | None, str]] = []
    for part in backend.lower().split(","):
        device, _, name = part.strip().rpartition(":")
        pairs.append((device.strip() or None, name.strip()))
    return pairs
