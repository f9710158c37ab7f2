"""XlaFullyShardedDataParallel's shards and whole weights, turned into each other without torch_xla.

XlaFSDP (with ``flatten_parameters=False``) keeps each parameter as one flat shard per rank: the parameter
flattened, padded, split equally over the ranks. ``get_shard_metadata()`` names each shard's original parameter
and size. Putting the shards in rank order and cutting the padding gives the parameter back; the names lose
the wrappers' ``_fsdp_wrapped_module``/``_fpw_module`` parts, so the result is the user module's own state dict.
This runs on plain tensors, so ``stratagem consolidate`` works where torch_xla is not installed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

_WRAPPER_PARTS = frozenset({"_fsdp_wrapped_module", "_fpw_module", "_fsdp_shard"})
_SEPARATOR = "_FSDP_SHARD_SEPARATOR_"


def plain_name(name: str) -> str:
    """``name`` without the parts XlaFSDP's wrappers add."""
    parts = name.replace(_SEPARATOR, ".").split(".")
    return ".".join(part for part in parts if part and part not in _WRAPPER_PARTS)


def shard_names(metadata: dict[str, Any]) -> dict[str, tuple[str, torch.Size]]:
    """Each shard's state-dict key mapped to its parameter's plain name and original size."""
    names = {}
    for prefix, shards in metadata["shard_info"].items():
        for key, info in shards.items():
            full_key = f"{prefix}.{key}" if prefix else key
            original = f"{prefix}.{info['_orig_name']}" if prefix else info["_orig_name"]
            names[full_key] = (plain_name(original), torch.Size(info["_orig_size"]))
    return names


def whole_state(shard_states: Sequence[dict[str, torch.Tensor]], metadata: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The whole module state from every rank's shard state dict (in rank order)."""
    return whole_state_gathered(
        shard_states[0], metadata, lambda key: torch.cat([s[key].reshape(-1) for s in shard_states])
    )


def whole_state_gathered(
    state: dict[str, torch.Tensor], metadata: dict[str, Any], gather: Callable[[str], torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The whole module state from this rank's shard ``state``; ``gather(key)`` gives the shard ``key`` of
    every rank concatenated in rank order (a collective during a run, files after it)."""
    names = shard_names(metadata)
    whole: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key in names:
            name, size = names[key]
            whole[name] = gather(key)[: size.numel()].reshape(size).clone()
        else:
            whole[plain_name(key)] = value
    return whole


def shard_of(whole: torch.Tensor, shard: torch.Tensor, rank: int) -> torch.Tensor:
    """Rank ``rank``'s part of ``whole``, shaped like its current ``shard`` (padding with zeros)."""
    length = shard.numel()
    flat = whole.reshape(-1)
    padded = torch.zeros(length * (rank + 1), dtype=whole.dtype)
    end = min(flat.numel(), padded.numel())
    padded[:end] = flat[:end]
    return padded[rank * length : (rank + 1) * length].reshape(shard.shape)
