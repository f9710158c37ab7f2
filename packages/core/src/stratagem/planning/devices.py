"""The accelerators a cluster plan can target: memory, bf16 throughput and links, from their makers' datasheets."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

GIB = 1024**3
GB_PER_S = 1e9


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator as the cluster planner models it."""

    name: str
    memory_bytes: int
    """Memory of one device (the card's label read as GiB; the planner keeps a safety margin below it)."""
    bf16_flops: float
    """Dense (not structured-sparse) bf16 tensor-core peak, FLOP/s."""
    intra_node_bytes_per_s: float
    """Bandwidth one device sends to the others of its node, one direction (half the bidirectional NVLink figure)."""
    inter_node_bytes_per_s: float
    """Bandwidth one device sends to other nodes, one direction: the network adapter per device of the
    maker's reference system."""
    host_bytes_per_s: float
    """Bandwidth between the device and host memory, one direction (its PCIe link): what offloaded state crosses."""
    source: str


# Sources (checked 2026-12): NVIDIA's A100 and H100/H200 Tensor Core GPU datasheets and the DGX A100 / DGX H100 /
# DGX B200 datasheets (8 GPUs per node, one 200 Gb/s HDR (A100) or 400 Gb/s NDR ConnectX-7 (H100, H200, B200) port
# per GPU); NVIDIA's L40S datasheet (PCIe Gen4 x16, no NVLink); AMD's Instinct MI300X datasheet (Infinity Fabric,
# 896 GB/s aggregate bidirectional peer bandwidth). Datasheets quote bf16 "with sparsity"; these are half of that.
# Host links: PCIe Gen4 x16 (A100, L40S) 32 GB/s and Gen5 x16 (H100, H200, B200, MI300X) 64 GB/s per direction.
DEVICES: dict[str, DeviceSpec] = {
    spec.name: spec
    for spec in (
        DeviceSpec(
            "a100-40gb",
            40 * GIB,
            312e12,
            300 * GB_PER_S,
            25 * GB_PER_S,
            32 * GB_PER_S,
            "NVIDIA A100 datasheet, DGX A100",
        ),
        DeviceSpec(
            "a100-80gb",
            80 * GIB,
            312e12,
            300 * GB_PER_S,
            25 * GB_PER_S,
            32 * GB_PER_S,
            "NVIDIA A100 datasheet, DGX A100",
        ),
        DeviceSpec(
            "h100-80gb",
            80 * GIB,
            989e12,
            450 * GB_PER_S,
            50 * GB_PER_S,
            64 * GB_PER_S,
            "NVIDIA H100 SXM datasheet, DGX H100",
        ),
        DeviceSpec(
            "h200-141gb", 141 * GIB, 989e12, 450 * GB_PER_S, 50 * GB_PER_S, 64 * GB_PER_S, "NVIDIA H200 SXM datasheet"
        ),
        DeviceSpec(
            "b200-180gb", 180 * GIB, 2250e12, 900 * GB_PER_S, 50 * GB_PER_S, 64 * GB_PER_S, "NVIDIA DGX B200 datasheet"
        ),
        DeviceSpec(
            "l40s-48gb", 48 * GIB, 362e12, 32 * GB_PER_S, 25 * GB_PER_S, 32 * GB_PER_S, "NVIDIA L40S datasheet (PCIe)"
        ),
        DeviceSpec(
            "mi300x-192gb",
            192 * GIB,
            1307e12,
            448 * GB_PER_S,
            50 * GB_PER_S,
            64 * GB_PER_S,
            "AMD Instinct MI300X datasheet",
        ),
    )
}

DEFAULT_DEVICE = "h100-80gb"
"""Whose throughput and links a plan given only ``--device-memory`` assumes (and says so)."""


def device_spec(name: str) -> DeviceSpec:
    """The device called ``name`` (case-insensitive); ``ValueError`` listing the known ones otherwise."""
    found = DEVICES.get(name.lower())
    if found is not None:
        return found
    close = difflib.get_close_matches(name.lower(), list(DEVICES), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(
        f"--device={name!r} is not a known device.{hint} Known: {', '.join(DEVICES)}; or give --device-memory "
        "(e.g. 80GiB) for another card."
    )


_UNITS = {"": 1, "b": 1, "kib": 1024, "mib": 1024**2, "gib": GIB, "tib": 1024**4, "kb": 1e3, "mb": 1e6, "gb": 1e9}


def parse_size(text: str, option: str) -> int:
    """Bytes from ``80GiB``, ``80GB``, ``512MiB`` or a plain number of bytes; ``ValueError`` naming ``option``."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS or float(match.group(1)) <= 0:
        raise ValueError(
            f"{option}={text!r} is not valid; expected a positive size such as 80GiB, 80GB or 512MiB "
            "(units: KiB, MiB, GiB, TiB, KB, MB, GB, or none for bytes)."
        )
    return int(float(match.group(1)) * _UNITS[unit])
