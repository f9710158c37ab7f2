"""Making every rank start from the weights rank 0 built, however each rank was seeded and whatever it built on.

A module reaches ``setup_module`` built eagerly on every rank (before the run, or with ``empty_init=False``),
or built eagerly on rank 0 and on the meta device elsewhere (``configure_model``, see
:mod:`stratagem.strategies.rank_zero_build`). Either way rank 0 holds the whole values: :class:`RankZeroValues`
keeps them (from their creation, so that blocks the user shards in ``configure_model`` are covered too, and
just before sharding) and, once the module is sharded, hands every rank its shard of them, one tensor at a
time. Nothing is re-initialised, so the values are the eager build's whatever the module's construction did.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.nn.modules.module import (
    register_module_buffer_registration_hook,
    register_module_parameter_registration_hook,
)


def _is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _is_whole(tensor: torch.Tensor | None) -> bool:
    return isinstance(tensor, torch.Tensor) and not isinstance(tensor, DTensor) and not tensor.is_meta


class RankZeroValues:
    """Rank 0's whole parameters and buffers, keyed by the module and name they are registered under."""

    def __init__(self) -> None:
        # The module is kept with its tensor so that its id is not reused while the entry lives.
        self._wholes: dict[tuple[int, str], tuple[nn.Module, torch.Tensor]] = {}

    def __getstate__(self) -> dict[str, object]:
        # A strategy sent to new processes (a module built under trainer.init_module() before the launch): the
        # ids are this process's, and a module unpickled there keeps its whole tensors itself.
        return {"_wholes": {}}

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        """Within the block, keep every whole tensor registered on a module (later in-place changes included)."""

        def record(module: nn.Module, name: str, tensor: torch.Tensor | None) -> None:
            if _is_whole(tensor):
                assert tensor is not None
                self._wholes[(id(module), name)] = (module, tensor)

        handles = [
            register_module_parameter_registration_hook(record),
            register_module_buffer_registration_hook(record),
        ]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def keep_present(self, module: nn.Module) -> None:
        """Keep the whole tensors ``module`` holds now (sharding is about to replace them by shards)."""
        for submodule in module.modules():
            for name, tensor in (*submodule._parameters.items(), *submodule._buffers.items()):
                if _is_whole(tensor):
                    assert tensor is not None
                    self._wholes[(id(submodule), name)] = (submodule, tensor)

    def hand_out(self, module: nn.Module, device: torch.device, parameters: bool = True) -> None:
        """Overwrite every rank's buffers and, with ``parameters``, parameters (its shards of them) with rank 0's
        values, then forget them.

        Entries rank 0 kept no whole tensor for are left as they are. ``device`` is where collectives run
        (the strategy's root device); one whole tensor at a time is made there.
        """
        if not _is_distributed():
            # One rank: its shards were cut from these very tensors.
            self._wholes.clear()
            return
        entries = [entry for entry in _entries(module) if parameters or not isinstance(entry[2], nn.Parameter)]
        holder = [[(id(owner), name) in self._wholes for owner, name, _ in entries]]
        dist.broadcast_object_list(holder, src=0)
        with torch.no_grad():
            for (owner, name, tensor), sent in zip(entries, holder[0]):
                if sent:
                    whole = self._wholes.get((id(owner), name))
                    _receive(tensor, None if whole is None else whole[1], device)
        self._wholes.clear()


def _entries(module: nn.Module) -> Iterator[tuple[nn.Module, str, torch.Tensor]]:
    """Each distinct parameter and buffer once (tied weights once), in the same order on every rank."""
    seen: set[int] = set()
    for submodule in module.modules():
        for name, tensor in (*submodule._parameters.items(), *submodule._buffers.items()):
            if tensor is None or id(tensor) in seen:
                continue
            seen.add(id(tensor))
            yield submodule, name, tensor


def _receive(tensor: torch.Tensor, whole: torch.Tensor | None, device: torch.device) -> None:
    """Give ``tensor`` (this rank's shard if it is a DTensor) rank 0's ``whole``; only rank 0 passes one."""
    source = (
        whole.detach().to(device=device, dtype=tensor.dtype)
        if whole is not None
        else torch.empty(tensor.shape, dtype=tensor.dtype, device=device)
    )
    # Sent whole from global rank 0 over the world, then cut locally: a DTensor on a submesh (HSDP's, or
    # dp_shard beside tp) has groups without global rank 0, whose own "rank 0" holds no value to send.
    dist.broadcast(source, src=0)
    if isinstance(tensor, DTensor):
        part = distribute_tensor(source, tensor.device_mesh, tensor.placements, src_data_rank=None)
        tensor.to_local().copy_(part.to_local())
        return
    tensor.copy_(source)
