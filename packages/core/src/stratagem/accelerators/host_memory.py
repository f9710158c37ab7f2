"""This process's peak resident memory (RSS), what the CPU accelerator reports as its peak memory."""

from __future__ import annotations

import sys
from pathlib import Path

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def reset_peak_resident_memory() -> bool:
    """Make the peak start again from the memory resident now (Linux: ``5`` to ``/proc/self/clear_refs``);
    whether it could. Where it cannot, the peak counts from the start of the process."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def peak_resident_bytes() -> int | None:
    """The most memory this process has had resident since the last reset (or its start), in bytes."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource  # not on Windows

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except (ImportError, OSError, ValueError):
        return None
    # Kilobytes on Linux, bytes on macOS.
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024
