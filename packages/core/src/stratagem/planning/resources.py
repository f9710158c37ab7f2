"""The memory and disk this machine lets a run use, as the planner sees them."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class Resources:
    """What the processes of a run on this machine share (bytes)."""

    host_memory_bytes: int
    """Host memory available: the smaller of the kernel's ``MemAvailable`` and the room left in this process's
    memory cgroup."""
    device_memory_bytes: int | None
    """Free memory of one accelerator device, ``None`` when the devices are the host's CPU."""
    disk_bytes: int
    """Free space where offloaded state and checkpoints would go."""
    process_bytes: int = 0
    """Host memory one rank holds before any model exists (this process's resident size: the interpreter, torch
    and the script's own data), added per rank to what a strategy estimates."""


def visible_resources(device: torch.device, disk_path: str | os.PathLike[str] = ".") -> Resources:
    """What a run computing on ``device`` can use here."""
    device_memory = None
    if device.type == "cuda":
        device_memory, _ = torch.cuda.mem_get_info(device)
    return Resources(
        host_memory_bytes=host_memory_bytes(),
        device_memory_bytes=device_memory,
        disk_bytes=shutil.disk_usage(_existing(Path(disk_path))).free,
        process_bytes=_resident_bytes(),
    )


def host_memory_bytes() -> int:
    """Available host memory, capped by the cgroup (v2) this process runs in, so a run inside a memory
    limit plans for the limit and not for the machine."""
    available = _meminfo_available()
    limit = _cgroup_room()
    return min(available, limit) if limit is not None else available


def _meminfo_available() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def _cgroup_room() -> int | None:
    """How much more this process's memory cgroup lets it use (v2 ``memory.max``, or v1
    ``memory.limit_in_bytes``, less current use), or ``None`` without a limit."""
    try:
        entries = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in entries:
        _, controllers, relative = line.split(":", 2)
        if controllers == "":
            room = _room(Path("/sys/fs/cgroup") / relative.lstrip("/"), "memory.max", "memory.current")
        elif "memory" in controllers.split(","):
            directory = Path("/sys/fs/cgroup/memory") / relative.lstrip("/")
            room = _room(directory, "memory.limit_in_bytes", "memory.usage_in_bytes")
        else:
            continue
        if room is not None:
            return room
    return None


def _room(directory: Path, limit_file: str, usage_file: str) -> int | None:
    try:
        limit = (directory / limit_file).read_text().strip()
        usage = int((directory / usage_file).read_text().strip())
    except (OSError, ValueError):
        return None
    # cgroup v1 writes "no limit" as a page-rounded 2**63.
    if limit == "max" or int(limit) >= 2**62:
        return None
    return max(0, int(limit) - usage)


def _resident_bytes() -> int:
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def _existing(path: Path) -> Path:
    path = path.resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path
