"""Having the C allocator hand the memory of freed tensors back to the system at once.

glibc serves allocations of 128 KiB and more from mappings of their own, but each time such a block is
freed it raises that threshold (up to 32 MiB), so the tensors a training step makes and frees (buckets,
gathered parameters, the optimizer's temporaries) soon come from the heap, where freed memory stays
with the process and fragments. Under DeepSpeed ZeRO-3 on the CPU (a 109M-parameter decoder, 2 ranks,
8 steps) each rank then held 3.2-3.4 GiB at its peak while its live tensors and the interpreter took
about 1.7 GiB. A fixed threshold returns every block above it to the system when it is freed: the peak
fell to 1.71 GiB, and each step took 1.45x as long, since every large allocation now starts from fresh
pages. FSDP on the CPU (same model, 6 steps) held 1.69 GiB at its peak and 1.36 GiB with the setting, at
1.35x per step; ``ddp`` gained nothing (2.48 against 2.43 GiB) and paid 1.2-1.3x. A strategy whose point is
memory can choose that trade (``release_host_memory=``); nothing does it behind the user's back.
"""

from __future__ import annotations

import ctypes
import sys

DEFAULT_RELEASE_THRESHOLD_BYTES = 1 << 20
"""Blocks of 1 MiB and more are returned when freed; 4 MiB gave the same peak there, 16 MiB a 17% higher one."""

_M_MMAP_THRESHOLD = -3


def release_freed_host_memory(threshold_bytes: int = DEFAULT_RELEASE_THRESHOLD_BYTES) -> bool:
    """From now on, this process's allocations of ``threshold_bytes`` or more get mappings of their own that
    go back to the system when freed (glibc's ``mallopt(M_MMAP_THRESHOLD)``, which also stops the threshold
    from rising). Returns whether the allocator took the setting: False, changing nothing, where the C library
    is not glibc or glibc refuses the size."""
    if not isinstance(threshold_bytes, int) or isinstance(threshold_bytes, bool) or not 0 < threshold_bytes < 2**31:
        raise ValueError(
            f"threshold_bytes={threshold_bytes!r} is not valid; expected a positive number of bytes below 2 GiB."
        )
    libc = glibc()
    if libc is None:
        return False
    mallopt = libc.mallopt
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold_bytes))


def check_release_host_memory(owner: str, value: object) -> bool | None:
    """``value`` as a strategy's ``release_host_memory`` option (``owner`` names the strategy in the error):
    ``None`` (decide by accelerator, see :func:`releases_host_memory`), ``True`` or ``False``."""
    if value is not None and not isinstance(value, bool):
        raise TypeError(
            f"{owner}(release_host_memory={value!r}) is not valid; expected None (yes on the CPU accelerator), "
            "True or False."
        )
    return value


def releases_host_memory(option: bool | None, device_type: str) -> bool:
    """Whether a strategy with the ``release_host_memory`` ``option`` calls :func:`release_freed_host_memory` in
    each rank: as given, or by default on the CPU accelerator, where a sharded run's states are host memory and
    the heap would otherwise keep what every step frees."""
    return option if option is not None else device_type == "cpu"


TIGHT_SHARE = 0.5
"""Host memory is tight when the ranks of one machine would need more than this share of what it has available."""


def host_memory_is_tight(bytes_per_rank: int, ranks_on_host: int) -> bool:
    """Whether ``ranks_on_host`` ranks needing ``bytes_per_rank`` each would take more than :data:`TIGHT_SHARE` of
    the host memory available now (``MemAvailable``); ``False`` where that is not known (not Linux)."""
    available = available_host_bytes()
    return available is not None and bytes_per_rank * ranks_on_host > TIGHT_SHARE * available


def available_host_bytes() -> int | None:
    """The memory the system could hand out now without swapping (Linux's ``MemAvailable``), else ``None``."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def glibc() -> ctypes.CDLL | None:
    """This process's C library where it is glibc (whose ``mallopt`` takes ``M_MMAP_THRESHOLD``), else ``None``."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - present only in glibc
        libc.mallopt  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc
