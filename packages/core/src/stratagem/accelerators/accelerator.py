"""The Accelerator interface: what kind of device a strategy runs on."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch


class Accelerator(ABC):
    """A kind of device (CPU, CUDA GPU, ...).

    A backend implements the three abstract members; everything else (device parsing, the
    default process-group backend, autocast support) is derived from them and may be
    overridden where a device differs.
    """

    device_type: ClassVar[str]
    """The ``torch.device`` type of this accelerator, e.g. ``"cpu"`` or ``"cuda"``."""

    process_group_backend: ClassVar[str] = "gloo"
    """The ``torch.distributed`` backend used when the user names none."""

    @staticmethod
    @abstractmethod
    def is_available() -> bool:
        """Whether this accelerator can be used in this process (driver, devices present)."""

    @staticmethod
    @abstractmethod
    def device_count() -> int:
        """How many devices of this kind this machine has."""

    @staticmethod
    @abstractmethod
    def unavailable_reason() -> str:
        """One line saying why :meth:`is_available` is false, for error messages and the CLI."""

    def setup_device(self, device: torch.device) -> None:
        """Make ``device`` the current device of this process (a no-op where there is none)."""

    def teardown(self) -> None:
        """Release what :meth:`setup_device` acquired."""

    def auto_device_count(self) -> int:
        """How many devices ``devices="auto"`` selects."""
        return self.device_count()

    def supports_autocast(self, dtype: torch.dtype) -> bool:
        """Whether ``torch.autocast`` works on this device with ``dtype``."""
        try:
            with torch.autocast(self.device_type, dtype=dtype):
                pass
        except (RuntimeError, ValueError):
            return False
        return True

    def needs_grad_scaler(self, dtype: torch.dtype) -> bool:
        """Whether mixed precision in ``dtype`` needs a gradient scaler on this device."""
        return dtype == torch.float16

    def reset_peak_memory(self, device: torch.device) -> None:
        """Start counting :meth:`peak_memory_bytes` anew (the fit loop calls it when training starts)."""

    def peak_memory_bytes(self, device: torch.device) -> int | None:
        """The most memory this process held on ``device`` since :meth:`reset_peak_memory`, or ``None`` where
        the backend cannot tell."""
        return None

    def synchronize(self, device: torch.device) -> None:
        """Wait until the work queued on ``device`` is done, so that a clock read after it measures that work."""

    def get_device(self, index: int) -> torch.device:
        """The ``torch.device`` for the device at ``index``."""
        return torch.device(self.device_type, index)

    def parse_devices(self, devices: int | list[int] | str) -> list[torch.device]:
        """Turn the user's ``devices`` value into concrete devices, failing clearly.

        Accepts a count (``2``; ``-1`` for all), a list of indices (``[0, 2]``), a string of
        either (``"2"``, ``"0,1"``, ``"-1"``) or ``"auto"``.
        """
        indices = _parse_device_indices(devices, available=self.auto_device_count(), kind=self.device_type)
        return [self.get_device(i) for i in indices]


def _parse_device_indices(devices: int | list[int] | str, *, available: int, kind: str) -> list[int]:
    accepted = 'a positive int, -1 (all), a list of indices such as [0, 1], "0,1" or "auto"'
    original = devices
    if isinstance(devices, str):
        text = devices.strip()
        if text == "auto":
            devices = available
        elif "," in text or text.startswith("["):
            try:
                devices = [int(part) for part in text.strip("[]").split(",") if part.strip()]
            except ValueError:
                raise ValueError(f"devices={original!r} is not valid; expected {accepted}.") from None
        else:
            try:
                devices = int(text)
            except ValueError:
                raise ValueError(f"devices={original!r} is not valid; expected {accepted}.") from None
    if isinstance(devices, bool):
        raise TypeError(f"devices={original!r} is not valid; expected {accepted}.")
    if isinstance(devices, int):
        if devices == -1:
            devices = available
        if devices <= 0:
            raise ValueError(f"devices={original!r} is not valid; expected {accepted}.")
        if kind != "cpu" and devices > available:
            raise ValueError(
                f"devices={original!r} asks for {devices} {kind} device(s) but this machine has {available}."
            )
        return list(range(devices))
    if isinstance(devices, list | tuple):
        if not devices or not all(isinstance(i, int) and not isinstance(i, bool) for i in devices):
            raise ValueError(f"devices={original!r} is not valid; expected {accepted}.")
        if len(set(devices)) != len(devices):
            raise ValueError(f"devices={original!r} names a device more than once.")
        if kind != "cpu":
            missing = [i for i in devices if i < 0 or i >= available]
            if missing:
                raise ValueError(
                    f"devices={original!r} names {kind} device(s) {missing}, but this machine has "
                    f"{available} (indices 0..{available - 1})."
                )
        return list(devices)
    raise TypeError(f"devices={original!r} has type {type(original).__name__}; expected {accepted}.")
