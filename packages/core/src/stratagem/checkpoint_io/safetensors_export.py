"""A checkpoint's module weights as a Hugging Face model directory of safetensors files.

What ``transformers``' ``from_pretrained(directory)`` reads: ``model.safetensors``, or for weights larger
than one shard ``model-00001-of-0000N.safetensors`` ... and ``model.safetensors.index.json`` mapping
each key to its file. Keys are the wrapped model's own names: a stratagem Module holds the Hugging
Face model as an attribute (``self.model``), whose name prefixes every key of the checkpoint and is
stripped here.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from stratagem.checkpoint_io.atomic import move_into_place, temporary_sibling

DEFAULT_MAX_SHARD_SIZE = 5 * 1000**3
"""Bytes per file before the weights are split over several (``transformers``' own default, "5GB")."""

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_SHARD_FILE = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
_UNITS = {"": 1, "B": 1, "KB": 1000, "MB": 1000**2, "GB": 1000**3, "KIB": 1024, "MIB": 1024**2, "GIB": 1024**3}


def parse_size(text: str) -> int:
    """Bytes in ``text``: a plain number or one with a unit (``"500MB"``, ``"2GiB"``, as ``transformers`` writes it)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).upper() if match else ""
    if match is None or unit not in _UNITS or float(match.group(1)) * _UNITS[unit] < 1:
        raise ValueError(
            f"--max-shard-size={text!r} is not a size; give a positive number of bytes, optionally with a unit "
            f"({', '.join(unit for unit in _UNITS if unit)}), e.g. '5GB' or '500MB'."
        )
    return int(float(match.group(1)) * _UNITS[unit])


def hugging_face_weights(
    checkpoint: Mapping[str, Any], prefix: str | None = None, module_key: str = "module"
) -> dict[str, torch.Tensor]:
    """The module weights of ``checkpoint`` named as the model inside the Module names them.

    ``prefix``: the part of every key to strip, with its dot (``"model."``); only keys that start
    with it are kept. ``None`` strips the Module's one top-level attribute when every key shares it,
    and refuses otherwise, naming them; ``""`` keeps the keys as they are.
    """
    if module_key not in checkpoint:
        raise ValueError(
            f"The checkpoint holds no {module_key!r} entry with module weights; it holds {list(checkpoint)}."
        )
    state = checkpoint[module_key]
    if not isinstance(state, Mapping) or not state:
        raise ValueError(f"The checkpoint's {module_key!r} entry is not a state dict of module weights.")
    if prefix is None:
        prefix = _only_top_level_prefix(list(state))
    kept = {key[len(prefix) :]: value for key, value in state.items() if key.startswith(prefix)}
    if not kept:
        found = sorted({key.split(".", 1)[0] + "." for key in state})
        raise ValueError(f"--prefix={prefix!r} matches no weight; the keys start with {', '.join(found)}")
    not_tensors = [key for key, value in kept.items() if not isinstance(value, torch.Tensor)]
    if not_tensors:
        raise ValueError(
            f"safetensors holds tensors only, but these entries of the module state are not: {', '.join(not_tensors)}."
        )
    return kept


def _only_top_level_prefix(keys: list[str]) -> str:
    heads = sorted({key.split(".", 1)[0] for key in keys})
    if len(heads) == 1 and all("." in key for key in keys):
        return heads[0] + "."
    raise ValueError(
        f"The module's weights sit under several attributes ({', '.join(heads)}), so which one is the Hugging Face "
        "model is not clear: pass --prefix with that attribute and a dot (e.g. --prefix model.), or --prefix '' to "
        "keep the keys whole."
    )


def write_safetensors_directory(
    weights: Mapping[str, torch.Tensor],
    directory: Path,
    max_shard_size: int = DEFAULT_MAX_SHARD_SIZE,
    overwrite: bool = False,
) -> list[Path]:
    """Write ``weights`` into ``directory`` as ``from_pretrained`` reads them; return the files written.

    Tensors that share memory with one written before (tied weights, such as a language-model head
    and the input embedding) are written once, under the first name: ``transformers`` ties them again
    on loading, as it does with what ``save_pretrained`` writes. Other files already in ``directory``
    (``config.json``, a tokenizer) are kept. The new weight files are written in a temporary directory
    beside it, which then replaces ``directory`` whole: a reader never finds old and new files mixed.
    """
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"DST={str(directory)!r} is a file; --format safetensors writes a directory.")
    existing = _weight_files(directory) if directory.is_dir() else []
    if existing and not overwrite:
        raise ValueError(
            f"DST={str(directory)!r} already holds weights ({', '.join(path.name for path in existing)}); pass "
            "--overwrite to replace them."
        )
    from safetensors.torch import save_file

    shards = _shards(_without_aliases(weights), max_shard_size)
    names = (
        [SINGLE_FILE]
        if len(shards) == 1
        else [f"model-{number:05d}-of-{len(shards):05d}.safetensors" for number in range(1, len(shards) + 1)]
    )
    staging = temporary_sibling(directory)
    staging.mkdir(parents=True)
    try:
        if directory.is_dir():
            for kept in directory.iterdir():
                if kept not in existing:
                    _copy(kept, staging / kept.name)
        for name, shard in zip(names, shards):
            save_file({key: tensor.contiguous() for key, tensor in shard.items()}, staging / name, {"format": "pt"})
        if len(shards) > 1:
            index = {
                "metadata": {"total_size": sum(_nbytes(tensor) for shard in shards for tensor in shard.values())},
                "weight_map": {key: name for name, shard in zip(names, shards) for key in sorted(shard)},
            }
            (staging / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        move_into_place(staging, directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return [directory / name for name in names] + ([directory / INDEX_FILE] if len(shards) > 1 else [])


def _weight_files(directory: Path) -> list[Path]:
    return sorted(
        path
        for path in directory.iterdir()
        if path.name in (SINGLE_FILE, INDEX_FILE) or _SHARD_FILE.fullmatch(path.name)
    )


def _copy(source: Path, target: Path) -> None:
    if source.is_dir() and not source.is_symlink():
        shutil.copytree(source, target, symlinks=True)
    else:
        shutil.copy2(source, target, follow_symlinks=False)


def _without_aliases(weights: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``weights`` less each tensor that is the same memory, shape and layout as one kept before it.

    A tensor overlapping another only in part is a view that safetensors cannot store as such: it is
    written as its own copy, so its values are kept whole.
    """
    kept: dict[str, torch.Tensor] = {}
    seen: set[tuple[Any, ...]] = set()
    storages: set[int] = set()
    for key, tensor in weights.items():
        tensor = tensor.detach()
        if tensor.device.type == "meta":
            raise ValueError(f"The weight {key!r} has no values (a tensor on the meta device).")
        identity = (
            _storage_pointer(tensor),
            tensor.storage_offset(),
            tuple(tensor.shape),
            tensor.stride(),
            tensor.dtype,
        )
        if identity in seen:
            continue
        seen.add(identity)
        pointer = _storage_pointer(tensor)
        kept[key] = tensor.clone() if pointer in storages else tensor
        storages.add(pointer)
    return kept


def _storage_pointer(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr() if tensor.numel() else id(tensor)


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _shards(weights: dict[str, torch.Tensor], max_shard_size: int) -> list[dict[str, torch.Tensor]]:
    """The weights in key order, split where a file would pass ``max_shard_size``; a larger tensor is a file alone."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for key, tensor in weights.items():
        if shards[-1] and size + _nbytes(tensor) > max_shard_size:
            shards.append({})
            size = 0
        shards[-1][key] = tensor
        size += _nbytes(tensor)
    return shards
