"""Giving back the host memory of DeepSpeed's NVMe parameter swappers when a run no longer needs them.

Every ``zero.Init`` that places parameters on NVMe (the strategy's own around ``configure_model``, and
the one the engine opens for parameters created outside it) builds an ``AsyncPartitionedParameterSwapper``
that page-locks ``buffer_count * buffer_size`` elements of host memory: 2 GiB per process in fp32 with
DeepSpeed's defaults. The lock comes from a process-wide pool that frees nothing when the swapper is
dropped, so each run in a process (fit, then validate, test, predict) added its swappers' buffers to the
last ones' until the host ran out of memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn


def swappers_of(parameters: Iterable[nn.Parameter]) -> list[Any]:
    """The NVMe swappers holding ``parameters``' partitions, each once, in first-seen order."""
    swappers: dict[int, Any] = {}
    for parameter in parameters:
        swapper = getattr(parameter, "nvme_swapper", None)
        if swapper is not None:
            swappers.setdefault(id(swapper), swapper)
    return list(swappers.values())


def release_swap_buffers(swapper: Any, parameters: Iterable[nn.Parameter]) -> None:
    """Free ``swapper``'s page-locked buffers, after its pending reads and writes finish.

    ``parameters`` are those it swapped: partitions kept in its buffers are marked swapped out first, so
    that nothing reads the freed memory. Call it only once their partitions are no longer needed (the
    module holds plain copies, or nothing was built on ``swapper``). Calling it again does nothing.
    """
    if getattr(swapper, "buffers", None) is None:
        return
    swapper.synchronize_writes()
    swapper.synchronize_reads()
    swapper.remove_partition_and_release_buffers([p for p in parameters if getattr(p, "nvme_swapper", None) is swapper])
    # Either handle frees any buffer: the page-locked pool is per process, not per handle.
    for name in ("buffers", "partitioned_swap_buffer"):
        buffer = getattr(swapper, name, None)
        if buffer is not None:
            swapper.aio_read_handle.free_cpu_locked_tensor(buffer)
            setattr(swapper, name, None)
    swapper.partitioned_swap_pool = None


def swapped_optimizer_sub_groups(optimizer: Any) -> list[int]:
    """The ZeRO-3 optimizer sub-groups whose fp32 partition and optimizer state live in NVMe swap files.

    DeepSpeed swaps a sub-group out only once its partition reaches the swapper's smallest swappable size
    (1 MiB by default); smaller ones stay in memory. ``optimizer`` is the engine's optimizer (any other
    has none).
    """
    is_swappable = getattr(optimizer, "_swappable_optimizer_subgroup", None)
    if is_swappable is None or not getattr(optimizer, "swap_optimizer", False):
        return []
    return [index for index in range(len(optimizer.fp16_groups)) if is_swappable(index)]


@contextmanager
def swapped_optimizer_state_in_memory(optimizer: Any) -> Iterator[None]:
    """Give every swapped-out sub-group's fp32 partition and optimizer state its values from the swap files.

    Between steps DeepSpeed keeps those tensors empty (their values are in the swap files), and its
    ``state_dict`` saves them as they are: a checkpoint with no master weights, which loads nowhere.
    Inside the block each one maps its swap file (which holds the tensor's elements from offset 0, padded
    at the end), read-only and copy-on-write: pages are read as the save reaches them and belong to the
    page cache, which the kernel reclaims under pressure, so a save holds no copy of the state in the
    process's own memory. On leaving they are emptied again. The swap files are never written.
    """
    swapper: Any = getattr(optimizer, "optimizer_swapper", None)
    held: list[Any] = []
    try:
        for index in swapped_optimizer_sub_groups(optimizer):
            swap_info = swapper._get_param_swap_info(optimizer.fp32_partitioned_groups_flat[index])
            for tensor in swap_info.tensors:
                tensor.compute_tensor.data = torch.from_file(
                    tensor.swap_path, shared=False, size=swap_info.numel(), dtype=swap_info.dtype()
                )
                held.append(tensor)
        yield
    finally:
        for tensor in held:
            tensor.compute_tensor.data = torch.Tensor()
