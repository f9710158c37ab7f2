"""A sharded ``xla_fsdp`` checkpoint's shards checked against each other and their metadata before any is used.

The files come from the user, so nothing in them is trusted: every entry ``whole_state`` reads is checked for
its type, each shard's size for agreeing with the other ranks' and with the size its metadata gives, all with
plain integers, so that a crafted size (negative, or terabytes) is refused without allocating anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod
from pathlib import Path
from typing import Any

import torch

from stratagem.checkpoint_io import CheckpointError


def checked_shards(
    shards: Sequence[object], files: Sequence[Path]
) -> tuple[list[dict[str, torch.Tensor]], dict[str, Any]]:
    """Every rank's ``module_shard`` (in rank order) and rank 0's ``shard_metadata``, once they are known to fit
    together; else a :class:`CheckpointError` naming the file and what is wrong with it."""
    world_size = len(files)
    checked = [
        _checked_shard(shard, file, rank, world_size)
        for rank, (shard, file) in enumerate(zip(shards, files, strict=True))
    ]
    states = [state for state, _ in checked]
    sizes = [_shard_sizes(metadata, file) for (_, metadata), file in zip(checked, files, strict=True)]
    for rank, file in enumerate(files):
        if sizes[rank] != sizes[0]:
            raise CheckpointError(
                f"{str(file)!r} describes other parameters than {files[0].name} (shard_metadata['shard_info'] "
                "differs): the files are not shards of one checkpoint."
            )
        if set(states[rank]) != set(states[0]):
            odd = sorted(set(states[rank]) ^ set(states[0]))
            raise CheckpointError(
                f"{str(file)!r} holds other module_shard entries than {files[0].name}: {', '.join(map(repr, odd[:5]))} "
                "is in one of them only."
            )
    for key, (name, size) in sizes[0].items():
        if key not in states[0]:
            raise CheckpointError(
                f"{str(files[0])!r}: shard_metadata names the shard {key!r} (of {name!r}), which module_shard lacks."
            )
        _check_shard_lengths(key, name, size, [state[key] for state in states], files)
    return states, checked[0][1]


def _checked_shard(
    shard: object, file: Path, rank: int, world_size: int
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    if not isinstance(shard, dict) or not isinstance(shard.get("module_shard"), dict):
        raise CheckpointError(f"{str(file)!r} is not an xla_fsdp shard: it holds no 'module_shard' dict.")
    metadata = shard.get("shard_metadata")
    if not isinstance(metadata, dict) or not isinstance(metadata.get("shard_info"), dict):
        raise CheckpointError(
            f"{str(file)!r} is not an xla_fsdp shard: it holds no 'shard_metadata' with 'shard_info'."
        )
    for field, expected in (("world_size", world_size), ("rank", rank)):
        value = metadata.get(field, expected)
        # A crafted value may be a tensor, whose == is no bool: only an int equal to the expected one passes.
        if not (type(value) is int and value == expected):
            raise CheckpointError(
                f"{str(file)!r} says {field}={value!r} in its shard_metadata, but its name and the "
                f"directory make it {field} {expected}: the file was renamed or comes from another checkpoint."
            )
    state = shard["module_shard"]
    for key, item in state.items():
        if not isinstance(key, str) or not isinstance(item, torch.Tensor):
            raise CheckpointError(
                f"{str(file)!r}: module_shard[{key!r}] is a {type(item).__name__}, not a tensor named by a string."
            )
    return state, metadata


def _shard_sizes(metadata: dict[str, Any], file: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    sizes = {}
    for prefix, shards in metadata["shard_info"].items():
        if not isinstance(prefix, str) or not isinstance(shards, dict):
            raise CheckpointError(f"{str(file)!r}: shard_info[{prefix!r}] is not a dict of shards named by a string.")
        for key, info in shards.items():
            where = f"{str(file)!r}: shard_info[{prefix!r}][{key!r}]"
            if not isinstance(key, str) or not isinstance(info, dict):
                raise CheckpointError(f"{where} is not a dict describing a shard.")
            name, size = info.get("_orig_name"), info.get("_orig_size")
            if not isinstance(name, str):
                raise CheckpointError(f"{where}['_orig_name'] is {name!r}, not a parameter's name.")
            if not isinstance(size, tuple | list) or not all(_is_size(dim) for dim in size):
                raise CheckpointError(f"{where}['_orig_size'] is {size!r}, not a shape of non-negative integers.")
            full_key = f"{prefix}.{key}" if prefix else key
            sizes[full_key] = (f"{prefix}.{name}" if prefix else name, tuple(size))
    return sizes


def _is_size(dim: object) -> bool:
    return isinstance(dim, int) and not isinstance(dim, bool) and dim >= 0


def _check_shard_lengths(
    key: str, name: str, size: tuple[int, ...], shards: Sequence[torch.Tensor], files: Sequence[Path]
) -> None:
    length, dtype = shards[0].numel(), shards[0].dtype
    for shard, file in zip(shards, files, strict=True):
        if shard.numel() != length or shard.dtype != dtype:
            raise CheckpointError(
                f"{str(file)!r}: the shard {key!r} holds {shard.numel()} {shard.dtype} values, {files[0].name}'s "
                f"{length} {dtype}: every rank's shard of a parameter has the same length and type."
            )
    needed = prod(size)
    if length * len(shards) < needed:
        raise CheckpointError(
            f"The shards {key!r} in {str(files[0].parent)!r} hold {length * len(shards)} values in all, but "
            f"shard_metadata gives {name!r} the shape {list(size)} ({needed} values)."
        )
