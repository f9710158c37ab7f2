"""Checkpoint directories in torch.distributed.checkpoint (DCP) format: written in shards, read whole or resharded."""

from __future__ import annotations

import functools
import io
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException, DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from stratagem.checkpoint_io import (
    CheckpointError,
    CheckpointIO,
    LazyCheckpoint,
    PathLike,
    check_checkpoint,
    checkpoint_files,
    explain_load_failure,
    load_torch_file,
    optional_checkpoint_file,
)
from stratagem.checkpoint_io.dcp_metadata import read_metadata
from stratagem.checkpoint_io.dcp_writes import FailedWritesNamedWriter, save_file
from stratagem.checkpoint_io.optimizer_state import is_name_keyed, to_index_keyed
from stratagem.checkpoint_io.staging import ProcessGroupRanks, write_staged

METADATA_FILE = ".metadata"
PLAIN_STATE_FILE = "plain_state.pt"


class DistributedCheckpointIO(CheckpointIO):
    """A checkpoint directory that torch.distributed.checkpoint wrote, plus one file of plain entries.

    Model state dicts and optimizer state dicts (or lists of them) are written through DCP:
    every rank writes the shards it holds, and a reader at any world size reads the pieces it
    needs. Every other entry (loop counters, precision state, ...) is written by rank 0 to
    ``plain_state.pt``. The directory is assembled under a temporary name and renamed into place.

    :meth:`save_checkpoint` is collective: every rank of the default process group calls it
    (one process without a group writes everything itself). :meth:`load_checkpoint` needs no
    process group and returns everything whole (each DCP-stored entry read when first taken), with
    optimizer states in the plain
    ``Optimizer.state_dict()`` layout, so any strategy loads it. With ``weights_only`` (the default)
    nothing read runs code: DCP's ``.metadata`` pickle is read by :mod:`stratagem.checkpoint_io.dcp_metadata`,
    tensors and plain entries by weights-only ``torch.load``. A file that cannot be read raises
    :class:`~stratagem.checkpoint_io.CheckpointError`.
    """

    writes_collectively: ClassVar[bool] = True

    def save_checkpoint(self, checkpoint: dict[str, Any], path: PathLike) -> None:
        sharded = {key: value for key, value in checkpoint.items() if is_sharded_state(value)}
        plain = {key: value for key, value in checkpoint.items() if key not in sharded}
        grouped = ProcessGroupRanks.grouped()

        def write_shards(staging: Path) -> None:
            with _quiet_single_process_warning():
                dcp.save(sharded, storage_writer=FailedWritesNamedWriter(staging), no_dist=not grouped)

        write_staged(
            Path(path), ProcessGroupRanks(), write_shards, lambda staging: save_file(plain, staging / PLAIN_STATE_FILE)
        )

    def load_checkpoint(
        self,
        path: PathLike,
        map_location: torch.device | str | None = "cpu",
        weights_only: bool = True,
    ) -> dict[str, Any]:
        directory = _existing_checkpoint(path)
        device = None if map_location is None else torch.device(map_location)
        keys = _top_level_keys(_reader(directory, weights_only))
        return _entries(directory, keys, weights_only, device)

    def load_into(
        self, path: PathLike, template: dict[str, Any], strict: bool = True, weights_only: bool = True
    ) -> dict[str, Any]:
        """Read the checkpoint's values for the keys of ``template`` into its tensors, in place.

        ``template`` holds state dicts shaped like the ones saved, possibly sharded differently
        (another world size): each rank reads the pieces its shards need. Collective when a
        process group exists. Returns the other entries; those stored through DCP (optimizer
        states nobody asked for, say) are read whole only if the caller takes them.
        """
        directory = _existing_checkpoint(path)
        reader = _reader(directory, weights_only)
        planner = _CheckedLoadPlanner(weights_only=weights_only, allow_partial_load=not strict)
        _load(directory, template, reader, planner, no_dist=not ProcessGroupRanks.grouped())
        unrequested = [key for key in _top_level_keys(reader) if key not in template]
        return _entries(directory, unrequested, weights_only, device=None)

    @classmethod
    def can_read(cls, path: PathLike) -> bool:
        return (Path(path) / METADATA_FILE).is_file()


class _PreReadMetadata(FileSystemReader):
    """A reader whose metadata was read and checked before DCP asks for it, and whose failure to
    read a piece names the piece's file.

    Read up front so that a refusal reaches the caller as it is: DCP catches errors of
    ``read_metadata`` and goes looking for per-rank metadata files instead.
    """

    def __init__(self, directory: Path, metadata: Metadata) -> None:
        super().__init__(directory)
        self._metadata = metadata
        self._piece: Any = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if self._metadata.storage_meta is None:
            self._metadata.storage_meta = StorageMeta()
        self._metadata.storage_meta.load_id = self.load_id
        return self._metadata

    def _slice_file(self, file: Any, sinfo: Any) -> Any:
        self._piece = sinfo
        return super()._slice_file(file, sinfo)

    def read_data(self, plan: Any, planner: Any) -> Any:
        self._piece = None
        try:
            return super().read_data(plan, planner)
        except CheckpointError:
            raise
        except Exception as error:
            if self._piece is None:
                raise
            piece = self._piece
            file = Path(self.path) / piece.relative_path
            where = f"{str(file)!r} (bytes {piece.offset} to {piece.offset + piece.length})"
            # A piece holds one tensor, which torch reads weights-only whatever the caller chose: bytes that
            # do not unpickle are corrupt, and torch's advice to set weights_only=False would not help.
            explained = explain_load_failure(where, error, weights_only=False)
            if explained is None:
                raise
            raise explained from error


def _reader(directory: Path, weights_only: bool) -> FileSystemReader:
    # DCP opens .metadata and the pieces it names by their names in the directory: none may be a link out
    # of it, a pipe or a device (whatever weights_only says, only files inside the checkpoint are read).
    checkpoint_files(directory)
    return _PreReadMetadata(directory, read_metadata(directory / METADATA_FILE, weights_only))


def _load(directory: Path, state: dict[str, Any], reader: FileSystemReader, planner: Any, no_dist: bool) -> None:
    """``dcp.load``, with a failure to read a piece reported as :class:`CheckpointError` naming the checkpoint."""
    try:
        with _quiet_single_process_warning():
            dcp.load(state, storage_reader=reader, planner=planner, no_dist=no_dist)
    except CheckpointException as wrapped:
        errors = [failure[0] if isinstance(failure, tuple) else failure for failure in wrapped.failures.values()]
        for error in errors:
            if isinstance(error, CheckpointError):
                raise error from None
        first = next((error for error in errors if isinstance(error, BaseException)), wrapped)
        raise CheckpointError(
            f"The checkpoint {str(directory)!r} cannot be loaded: {type(first).__name__}: {first}"
        ) from first


class _WeightsOnlyBytes:
    """Reads non-tensor entries with a weights-only ``torch.load`` when ``weights_only`` (DCP's own
    planner unpickles them without restriction)."""

    weights_only: bool

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        if not self.weights_only:
            super().load_bytes(read_item, value)  # type: ignore[misc]
            return
        try:
            loaded = torch.load(value, weights_only=True)
        except Exception as error:
            explained = explain_load_failure(f"The checkpoint entry {read_item.dest_index.fqn!r}", error, True)
            if explained is None:
                raise
            raise explained from error
        # What DefaultLoadPlanner.load_bytes does with the value it unpickled.
        planner: Any = self
        if planner.flatten_state_dict:
            set_element(planner.original_state_dict, planner.mappings[read_item.dest_index.fqn], loaded)
        else:
            planner.state_dict[read_item.dest_index.fqn] = loaded


class _CheckedLoadPlanner(_WeightsOnlyBytes, DefaultLoadPlanner):
    def __init__(self, weights_only: bool, allow_partial_load: bool) -> None:
        super().__init__(allow_partial_load=allow_partial_load)
        self.weights_only = weights_only


class _WholeCheckpointPlanner(_WeightsOnlyBytes, _EmptyStateDictLoadPlanner):
    """Builds the state from the checkpoint's metadata instead of a template (no model needed)."""

    def __init__(self, keys: set[str] | None, weights_only: bool) -> None:
        super().__init__(keys=keys)
        self.weights_only = weights_only


def _read_whole(directory: Path, keys: set[str] | None, weights_only: bool) -> dict[str, Any]:
    planner = _WholeCheckpointPlanner(keys, weights_only)
    _load(directory, {}, _reader(directory, weights_only), planner, no_dist=True)
    # dcp.load hands the planner a fresh dict to fill; the planner keeps the filled one.
    return dict(planner.original_state_dict)


def _entries(directory: Path, keys: list[str], weights_only: bool, device: torch.device | None) -> LazyCheckpoint:
    """The plain entries, and the DCP-stored ``keys``, each read whole when taken: a rank that evaluates
    never reads the optimizer state, and one that takes the module reads only the module."""
    entries = LazyCheckpoint()
    for key in keys:
        entries.defer(key, functools.partial(_read_entry, directory, key, weights_only, device))
    plain = _read_plain_entries(directory, weights_only)
    entries.update(plain if device is None or device.type == "cpu" else _move(plain, device))
    return entries


def _read_entry(directory: Path, key: str, weights_only: bool, device: torch.device | None) -> Any:
    value = _plain_optimizer_states(_read_whole(directory, keys={key}, weights_only=weights_only)[key])
    return value if device is None or device.type == "cpu" else _move(value, device)


def _top_level_keys(reader: FileSystemReader) -> list[str]:
    metadata = reader.read_metadata()
    paths = metadata.planner_data or {}
    return sorted({str(paths[key][0]) if key in paths else key.split(".")[0] for key in metadata.state_dict_metadata})


def _read_plain_entries(directory: Path, weights_only: bool) -> dict[str, Any]:
    file = optional_checkpoint_file(directory, PLAIN_STATE_FILE)
    if file is None:
        # Without it a resume would silently start over from step 0, with fresh schedulers and RNG.
        raise CheckpointError(
            f"The checkpoint {str(directory)!r} is incomplete: it lacks {PLAIN_STATE_FILE}, which holds its loop "
            "state, lr schedulers, RNG state and other entries besides the shards (was it copied in part?)."
        )
    return check_checkpoint(load_torch_file(file, weights_only=weights_only), file)


def _existing_checkpoint(path: PathLike) -> Path:
    directory = Path(path)
    if not DistributedCheckpointIO.can_read(directory):
        raise FileNotFoundError(
            f"No torch.distributed.checkpoint directory at {str(directory)!r} (no {METADATA_FILE})."
        )
    return directory


def is_sharded_state(value: object) -> bool:
    """Model state dicts and optimizer states (or lists of them): what DCP stores and reshards."""
    if _is_optimizer_state(value):
        return True
    if isinstance(value, list | tuple):
        return bool(value) and all(_is_optimizer_state(item) for item in value)
    return (
        isinstance(value, dict)
        and bool(value)
        and all(isinstance(key, str) and isinstance(item, torch.Tensor) for key, item in value.items())
    )


def _is_optimizer_state(value: object) -> bool:
    return isinstance(value, dict) and "param_groups" in value


def _plain_optimizer_states(value: Any) -> Any:
    """Optimizer states in the plain layout; DCP drops empty dicts, so a missing per-parameter state is empty."""
    if isinstance(value, list):
        return [_plain_optimizer_states(item) for item in value]
    if _is_optimizer_state(value):
        state = {"state": {}, **value}
        return to_index_keyed(state) if is_name_keyed(state) else state
    return value


def _move(value: Any, device: torch.device) -> Any:
    from torch.utils._pytree import tree_map

    return tree_map(lambda item: item.to(device) if isinstance(item, torch.Tensor) else item, value)


@contextmanager
def _quiet_single_process_warning() -> Iterator[None]:
    # DCP warns whenever it runs without collectives; here that is intended (one process, or a local read).
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield
