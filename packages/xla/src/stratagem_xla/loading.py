"""Batches fed to an XLA device through torch_xla's parallel loader."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import torch

_END = object()


def parallel_loader_batches(batches: Iterator[Any], device: torch.device, input_sharding: Any = None) -> Iterator[Any]:
    """``batches`` copied to ``device`` by a background thread, with the lazy graph cut before each batch.

    torch_xla's ``ParallelLoader`` syncs the device whenever the loop asks for the next batch, so the work
    traced for one step (forward, backward, optimizer step, logged values) runs as one graph, compiled once
    and reused. That is the step's only cut, as in torch_xla's own loop (``MpDeviceLoader`` and
    ``xm.optimizer_step`` without a barrier): a second one, after the optimizer step, would find nothing
    left to run and wait for the device instead, so the next step could not be traced while this one runs.
    A loop that stops before the data ends (``max_steps``) gets the same cut when it leaves, so its last
    step runs as the graph every step compiled to, not folded into whatever reads a value next.

    The first batch is read here, in the loop's thread: a sampler draws its order from the global random
    generator when it yields its first batch, and must not do so in the loader's thread while the loop uses
    that generator. ``input_sharding`` (SPMD) shards each batch over the device mesh.
    """
    import torch_xla
    from torch_xla.distributed.parallel_loader import ParallelLoader

    first = next(batches, _END)
    if first is _END:
        return
    loader = ParallelLoader(itertools.chain([first], batches), [device], input_sharding=input_sharding)
    try:
        yield from loader.per_device_loader(device)
    finally:
        loader.close()
        torch_xla.sync()
