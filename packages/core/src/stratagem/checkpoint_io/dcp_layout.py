"""Checking DCP metadata against itself and against the files it points into, before torch reads by it.

torch trusts ``.metadata``: it allocates every tensor at the size declared there (a crafted 1 TB
tensor is an allocation of 1 TB), leaves whatever no chunk covers uninitialised (garbage values
loaded as weights), and walks ``planner_data`` paths as given (a list index of 10**12 is a list of
10**12 items). Here every field is checked to have the type torch writes, every tensor to be covered
exactly once by its chunks, and every chunk's bytes to lie, without overlapping another's, in a
file of the checkpoint that is long enough to hold them. So what a load allocates is bounded by
the bytes on disk, and what it loads is what was saved.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import itertools
import math
import os
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

from stratagem.checkpoint_io import CheckpointError

MAX_PATH_LENGTH = 64
"""Most keys in one ``planner_data`` path: how deep a saved state dict nests (a real one nests under 10)."""

MAX_LIST_INDEX = 1_000_000
"""Largest list index in a ``planner_data`` path (DCP builds a list that long when it loads)."""

_MAX_GRID_CELLS = 1 << 22
"""Most cells of the grid that a tensor's chunk boundaries cut it into, for the coverage check (16 MB)."""

_SMALL_GRID_CELLS = 4096
"""Up to this many cells in all chunks, the coverage check counts in Python rather than in a tensor."""


_FIELD_NAMES: dict[type, frozenset[str]] = {
    cls: frozenset(field.name for field in dataclasses.fields(cls))
    for cls in (
        Metadata,
        TensorStorageMetadata,
        BytesStorageMetadata,
        ChunkStorageMetadata,
        TensorProperties,
        MetadataIndex,
        StorageMeta,
        _StorageInfo,
    )
}
"""The attributes each metadata class has: a crafted pickle may set others."""


class _Fault(Exception):
    """What is wrong with the metadata; the caller adds which file it is."""


def check_layout(metadata: object, file: Path) -> Metadata:
    """``metadata`` (unpickled from ``file``) if it is DCP metadata whose pieces are all present in the
    files beside ``file``; otherwise a :class:`CheckpointError` naming ``file`` and the fault."""
    try:
        checked = _check_types(metadata)
        sizes = _check_storage(checked.storage_data, file.parent)
        _check_tensors(checked, sizes)
        _check_planner_data(checked.planner_data)
    except _Fault as fault:
        raise CheckpointError(f"{str(file)!r} is not DCP metadata that matches its checkpoint: {fault}.") from None
    return checked


def _check_types(metadata: object) -> Metadata:
    _expect(metadata, Metadata, "the file")
    assert isinstance(metadata, Metadata)
    _expect_dict(metadata.state_dict_metadata, str, (TensorStorageMetadata, BytesStorageMetadata), "its entries")
    for name, entry in metadata.state_dict_metadata.items():
        _expect(entry, type(entry), f"the entry {_short(name)}")
        if isinstance(entry, TensorStorageMetadata):
            _check_tensor_types(name, entry)
    _expect_dict(metadata.storage_data, MetadataIndex, _StorageInfo, "its storage_data")
    for index, info in metadata.storage_data.items():
        if not isinstance(index.fqn, str) or not (index.offset is None or _is_size(index.offset)):
            raise _Fault(f"a storage key holds {_short(index.fqn)} and {_short(index.offset)}, not a name and offsets")
        _expect(index, MetadataIndex, f"the storage key of {_short(index.fqn)}")
        _expect(info, _StorageInfo, f"the storage of {_short(index.fqn)}")
        for field in ("offset", "length"):
            value = getattr(info, field)
            if type(value) is not int or value < 0:
                raise _Fault(f"the storage of {_short(index.fqn)} has the {field} {value!r}, not a non-negative int")
        if info.transform_descriptors:
            raise _Fault(
                f"the storage of {_short(index.fqn)} is transformed ({_short(info.transform_descriptors)}, e.g. "
                "compressed); "
                "stratagem reads only untransformed pieces, whose sizes it can check against the files"
            )
    if metadata.storage_meta is not None:
        meta = metadata.storage_meta
        _expect(meta, StorageMeta, "its storage_meta")
        if not (
            isinstance(meta.checkpoint_id, str | os.PathLike | None)
            and isinstance(meta.save_id, str | None)
            and isinstance(meta.load_id, str | None)
            and isinstance(meta.modules, list)
            and all(isinstance(module, str) for module in meta.modules)
        ):
            raise _Fault("its storage_meta holds values other than names")
    if not isinstance(metadata.version, str | None):
        raise _Fault(f"its version is {_kind(metadata.version)}, not a str")
    return metadata


def _check_tensor_types(name: str, entry: TensorStorageMetadata) -> None:
    _expect(entry.properties, TensorProperties, f"the properties of {_short(name)}")
    properties = entry.properties
    if not isinstance(properties.dtype, torch.dtype):
        raise _Fault(f"{_short(name)} has the dtype {_short(properties.dtype)}, not a torch.dtype")
    if not (
        isinstance(properties.layout, torch.layout)
        and isinstance(properties.memory_format, torch.memory_format)
        and isinstance(properties.requires_grad, bool)
        and isinstance(properties.pin_memory, bool)
    ):
        raise _Fault(f"the properties of {_short(name)} are not a layout, a memory format and flags")
    if not _is_size(entry.size):
        raise _Fault(f"{_short(name)} has the size {_short(entry.size)}, not a torch.Size of non-negative ints")
    if not isinstance(entry.chunks, list):
        raise _Fault(f"the chunks of {_short(name)} are {_kind(entry.chunks)}, not a list")
    for chunk in entry.chunks:
        _expect(chunk, ChunkStorageMetadata, f"a chunk of {_short(name)}")
        if not (_is_size(chunk.offsets) and _is_size(chunk.sizes)) or not (
            len(chunk.offsets) == len(chunk.sizes) == len(entry.size)
        ):
            raise _Fault(
                f"a chunk of {_short(name)} does not hold the offsets and sizes of a {len(entry.size)}-d tensor"
            )
        if any(start + extent > dim for start, extent, dim in zip(chunk.offsets, chunk.sizes, entry.size)):
            raise _Fault(
                f"a chunk of {_short(name)} (offsets {list(chunk.offsets)}, sizes {list(chunk.sizes)}) reaches "
                f"past its size {list(entry.size)}"
            )


def _check_storage(storage: dict[MetadataIndex, _StorageInfo], directory: Path) -> dict[str, int]:
    """The length of each piece file; every stored range lies inside its file, and no two overlap."""
    lengths: dict[str, int] = {}
    ranges: dict[str, list[tuple[int, int, str]]] = {}
    for index, info in storage.items():
        name = info.relative_path
        if name not in lengths:
            try:
                lengths[name] = (directory / name).stat().st_size
            except FileNotFoundError:
                raise _Fault(
                    f"it stores {_short(index.fqn)} in {_short(name)}, which is missing from the directory"
                ) from None
        if info.offset + info.length > lengths[name]:
            raise _Fault(
                f"it stores {_short(index.fqn)} at bytes {info.offset} to {info.offset + info.length} of "
                f"{_short(name)}, which has {lengths[name]} bytes (is the file truncated?)"
            )
        ranges.setdefault(name, []).append((info.offset, info.offset + info.length, index.fqn))
    for name, spans in ranges.items():
        spans.sort()
        for (_, end, first), (start, _, second) in itertools.pairwise(spans):
            if start < end:
                raise _Fault(f"it stores {_short(first)} and {_short(second)} in overlapping bytes of {_short(name)}")
    return lengths


def _check_tensors(metadata: Metadata, lengths: dict[str, int]) -> None:
    storage: dict[MetadataIndex, _StorageInfo] = metadata.storage_data
    for name, entry in metadata.state_dict_metadata.items():
        if isinstance(entry, BytesStorageMetadata):
            if MetadataIndex(name) not in storage:
                raise _Fault(f"it stores no bytes for the entry {_short(name)}")
            continue
        item_size = entry.properties.dtype.itemsize
        for chunk in entry.chunks:
            info = storage.get(MetadataIndex(name, chunk.offsets))
            if info is None:
                raise _Fault(f"it stores no bytes for the chunk of {_short(name)} at offsets {list(chunk.offsets)}")
            needed = math.prod(chunk.sizes) * item_size
            if info.length < needed:
                raise _Fault(
                    f"it declares the chunk of {_short(name)} at offsets {list(chunk.offsets)} as {list(chunk.sizes)} "
                    f"{entry.properties.dtype} ({needed} bytes), but stores {info.length} bytes for it in "
                    f"{_short(info.relative_path)}"
                )
        _check_coverage(name, entry)


def _check_coverage(name: str, entry: TensorStorageMetadata) -> None:
    """Each element of the tensor lies in exactly one chunk.

    The chunks' boundaries cut the tensor into a grid of cells, each either inside a chunk or
    not; counting, per cell, the chunks that hold it is exact and as cheap as the grid is small
    (one cell per chunk for the row shards FSDP writes).
    """
    boundaries = [
        sorted({0, dim, *(bound for c in entry.chunks for bound in (c.offsets[d], c.offsets[d] + c.sizes[d]))})
        for d, dim in enumerate(entry.size)
    ]
    grid = [len(cuts) - 1 for cuts in boundaries]
    if math.prod(grid) > _MAX_GRID_CELLS:
        raise _Fault(
            f"the {len(entry.chunks)} chunks of {_short(name)} are cut too irregularly to check that they cover it"
        )
    spans = [
        [
            (bisect.bisect_left(cuts, start), bisect.bisect_left(cuts, start + extent))
            for cuts, start, extent in zip(boundaries, chunk.offsets, chunk.sizes)
        ]
        for chunk in entry.chunks
    ]
    if sum(math.prod(end - start for start, end in span) for span in spans) <= _SMALL_GRID_CELLS:
        # Counted in Python: for the few cells of the usual layouts, faster than tensor operations.
        counts = collections.Counter(
            cell for span in spans for cell in itertools.product(*(range(start, end) for start, end in span))
        )
        overlap, covered = any(count > 1 for count in counts.values()), len(counts) == math.prod(grid)
    else:
        grid_counts = torch.zeros(grid, dtype=torch.int32)
        for span in spans:
            grid_counts[tuple(slice(start, end) for start, end in span)] += 1
        overlap, covered = bool((grid_counts > 1).any()), not bool((grid_counts == 0).any())
    if overlap:
        raise _Fault(f"chunks of {_short(name)} overlap")
    if not covered:
        raise _Fault(
            f"the chunks of {_short(name)} do not cover its size {list(entry.size)}: part of it was never saved"
        )


def _check_planner_data(planner_data: object) -> None:
    """Each path is a short tuple of names and list indices, and none is both a value and a container
    of values (DCP rebuilds the state dict from these paths)."""
    if planner_data is None:
        return
    if not isinstance(planner_data, dict):
        raise _Fault(f"its planner_data is {_kind(planner_data)}, not a dict of paths")
    containers: set[tuple[Any, ...]] = set()
    values: set[tuple[Any, ...]] = set()
    for name, path in planner_data.items():
        if not isinstance(name, str) or not isinstance(path, tuple | list) or not path:
            raise _Fault(f"its planner_data maps {_short(name)} to {_short(path)}, not to a path of keys")
        if len(path) > MAX_PATH_LENGTH:
            raise _Fault(f"its planner_data path for {_short(name)} nests {len(path)} deep (at most {MAX_PATH_LENGTH})")
        if not isinstance(path[0], str):
            raise _Fault(f"its planner_data path for {_short(name)} starts with {_short(path[0])}, not a name")
        for key in path:
            if not (isinstance(key, str) or (type(key) is int and 0 <= key <= MAX_LIST_INDEX)):
                raise _Fault(
                    f"its planner_data path for {_short(name)} holds {_short(key)}, not a name or a list index "
                    f"from 0 to {MAX_LIST_INDEX}"
                )
        containers.update(tuple(path[:depth]) for depth in range(1, len(path)))
        values.add(tuple(path))
    clash = next(iter(containers & values), None)
    if clash is not None:
        raise _Fault(f"its planner_data uses the path {list(clash)} both for a value and for a container of values")


def _expect(value: object, expected: type, what: str) -> None:
    """``value`` is exactly an ``expected`` with only its own fields (no attributes a crafted pickle added)."""
    if type(value) is not expected:
        raise _Fault(f"{what} is {_kind(value)}, not a {expected.__name__}")
    fields = _FIELD_NAMES.get(expected, frozenset())
    attributes = getattr(value, "__dict__", {}).keys()
    if not attributes <= fields:
        extra = attributes - fields
        raise _Fault(f"{what} carries attributes a {expected.__name__} does not have: {sorted(map(str, extra))[:5]}")


def _expect_dict(value: object, key_type: type, value_types: type | tuple[type, ...], what: str) -> None:
    if not isinstance(value, dict):
        raise _Fault(f"{what} is {_kind(value)}, not a dict")
    for key, item in value.items():
        if not isinstance(key, key_type) or not isinstance(item, value_types):
            raise _Fault(f"{what} map {_short(key)} to {_kind(item)}")


def _is_size(value: object) -> bool:
    return type(value) is torch.Size and all(dim >= 0 for dim in value)


def _short(value: object) -> str:
    if isinstance(value, str | int):
        text = repr(value)
        return text if len(text) <= 200 else text[:197] + "..."
    return _kind(value)


def _kind(value: object) -> str:
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"
