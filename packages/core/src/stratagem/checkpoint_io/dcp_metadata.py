"""Reading DCP's ``.metadata`` pickle without running code: only the classes DCP's metadata is made of.

torch's ``FileSystemReader.read_metadata`` unpickles the file with plain :mod:`pickle`, so a crafted
``.metadata`` would run its payload on any load, whatever ``weights_only`` says. Here the pickle may
name only the metadata dataclasses of ``torch.distributed.checkpoint`` (as torch 2.x writes them),
``torch.Size``, torch dtypes and layouts, and paths; anything else is refused with its name. What the
metadata declares is then checked against the checkpoint's files (:mod:`stratagem.checkpoint_io.dcp_layout`).
"""

from __future__ import annotations

import pickle
import struct
from pathlib import Path, PosixPath, PurePosixPath, PureWindowsPath, WindowsPath
from typing import Any, ClassVar

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    _MEM_FORMAT_ENCODING,
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.serialization import _get_layout

from stratagem.checkpoint_io import CheckpointError
from stratagem.checkpoint_io.dcp_layout import check_layout

_ALLOWED: dict[tuple[str, str], Any] = {
    **{("pathlib", path.__name__): path for path in (PosixPath, WindowsPath, PurePosixPath, PureWindowsPath)},
    **{
        (value.__module__, value.__qualname__): value
        for value in (
            Metadata,
            TensorStorageMetadata,
            BytesStorageMetadata,
            ChunkStorageMetadata,
            TensorProperties,
            MetadataIndex,
            StorageMeta,
            _MEM_FORMAT_ENCODING,
            _StorageInfo,
            _get_layout,
            torch.Size,
            PosixPath,
            WindowsPath,
            PurePosixPath,
            PureWindowsPath,
        )
    },
}


# What unpickling bytes that are not (or no longer) a pickle raises.
_CORRUPTION = (
    pickle.UnpicklingError,
    EOFError,
    ValueError,
    TypeError,
    AttributeError,
    KeyError,
    IndexError,
    struct.error,
)


class _Refused(pickle.UnpicklingError):
    """A pickle that would do more than rebuild metadata."""


class _MetadataUnpickler(pickle._Unpickler):  # type: ignore[name-defined,misc]
    """The pure-Python unpickler (its opcodes can be overridden) with an allowlist of globals."""

    dispatch: ClassVar[dict[int, Any]] = dict(pickle._Unpickler.dispatch)  # type: ignore[attr-defined]
    stack: list[Any]

    def find_class(self, module: str, name: str) -> Any:
        allowed = _ALLOWED.get((module, name))
        if allowed is not None:
            return allowed
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise _Refused(f"it references {module}.{name}, which is not part of DCP's metadata")

    def _load_build(self) -> None:
        # BUILD sets attributes; on a class (rather than an instance) it would change that class for the process.
        if isinstance(self.stack[-2], type):
            raise _Refused(f"it sets attributes of the class {self.stack[-2].__qualname__}")
        pickle._Unpickler.load_build(self)  # type: ignore[attr-defined]

    def _refuse_extension(self) -> None:
        # Extension codes name globals through copyreg's process-wide cache, past find_class.
        raise _Refused("it uses a copyreg extension code")

    dispatch[pickle.BUILD[0]] = _load_build
    for _opcode in (pickle.EXT1, pickle.EXT2, pickle.EXT4):
        dispatch[_opcode[0]] = _refuse_extension


def read_metadata(file: Path, weights_only: bool = True) -> Metadata:
    """The DCP metadata in ``file``, checked against the files beside it; :class:`CheckpointError` if it is not
    that. Unpickled without running code, unless not ``weights_only`` (a checkpoint the caller trusts)."""
    if file.stat().st_size == 0:
        raise CheckpointError(f"{str(file)!r} is an empty file, not DCP metadata (was its save interrupted?).")
    try:
        with file.open("rb") as stream:
            metadata = (_MetadataUnpickler(stream) if weights_only else pickle.Unpickler(stream)).load()
    except _Refused as error:
        raise CheckpointError(
            f"{str(file)!r} is not DCP metadata as torch writes it: {error}; unpickling it could run code. Only if "
            "you trust the checkpoint, load it with weights_only=False."
        ) from error
    except _CORRUPTION as error:
        raise _corrupt(file, error) from error
    _check_structure(metadata, file)
    return check_layout(metadata, file)


def _check_structure(metadata: object, file: Path) -> None:
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{str(file)!r} holds a {type(metadata).__name__}, not DCP metadata.")
    if not isinstance(metadata.state_dict_metadata, dict) or not isinstance(metadata.storage_data, dict):
        raise CheckpointError(f"{str(file)!r} is not DCP metadata: its entries are not dicts.")
    for info in metadata.storage_data.values():
        # Every piece lives in a file of the checkpoint directory itself, never elsewhere on disk.
        name = getattr(info, "relative_path", None)
        if (
            not isinstance(info, _StorageInfo)
            or not isinstance(name, str)
            or name in ("", ".", "..")
            or (Path(name).name != name or PureWindowsPath(name).name != name)
        ):
            raise CheckpointError(
                f"{str(file)!r} places a piece of the checkpoint at {name!r}, outside the checkpoint directory."
            )


def _corrupt(file: Path, error: BaseException) -> CheckpointError:
    return CheckpointError(
        f"{str(file)!r} is truncated or corrupt: it cannot be read as DCP metadata ({type(error).__name__}: {error})."
    )
