"""Hugging Face safetensors weights read piece by piece into a module set up by any strategy.

A ``from_pretrained`` directory holds ``model.safetensors``, or numbered files and
``model.safetensors.index.json`` naming each key's file. safetensors reads any slice of a tensor
without reading the rest, so a process that holds a shard of a parameter reads only that shard.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from stratagem.checkpoint_io.safetensors_export import INDEX_FILE, SINGLE_FILE

TensorIndex = tuple[slice, ...]


class SafetensorsWeights:
    """The tensors of a ``from_pretrained`` directory, opened lazily; use as a context manager to close them."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        index = self.directory / INDEX_FILE
        if (self.directory / SINGLE_FILE).is_file():
            self._files = {key: self.directory / SINGLE_FILE for key in self._keys_of(self.directory / SINGLE_FILE)}
        elif index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            self._files = {key: self.directory / name for key, name in weight_map.items()}
        else:
            raise ValueError(
                f"load_pretrained({str(directory)!r}): no {SINGLE_FILE} or {INDEX_FILE} there; give a directory that "
                "transformers' from_pretrained reads (save_pretrained or `stratagem consolidate --format safetensors` "
                "writes one)."
            )
        self._open: dict[Path, Any] = {}
        self._stack = ExitStack()

    def __enter__(self) -> SafetensorsWeights:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._stack.close()
        self._open.clear()

    def names(self) -> set[str]:
        """The names of the tensors the files hold."""
        return set(self._files)

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._handle(key).get_slice(key).get_shape())

    def read(self, key: str, index: TensorIndex | None = None) -> torch.Tensor:
        """The tensor ``key``, or only its part ``index`` (one slice per dimension), read from disk."""
        part = self._handle(key).get_slice(key)
        return part[index] if index is not None else part[:]

    def _handle(self, key: str) -> Any:
        file = self._files[key]
        if file not in self._open:
            from safetensors import safe_open

            self._open[file] = self._stack.enter_context(safe_open(str(file), framework="pt"))
        return self._open[file]

    @staticmethod
    def _keys_of(file: Path) -> list[str]:
        from safetensors import safe_open

        with safe_open(str(file), framework="pt") as handle:
            return list(handle.keys())


@dataclass(frozen=True)
class PretrainedRequest:
    """Weights to load into ``target`` once the strategy has set the module up (see ``Module.load_pretrained``)."""

    directory: Path
    target: nn.Module


def load_pretrained_weights(
    target: nn.Module,
    weights: SafetensorsWeights,
    copy: Callable[[str, torch.Tensor, SafetensorsWeights], None],
    global_shape: Callable[[torch.Tensor], tuple[int, ...]] = lambda tensor: tuple(tensor.shape),
) -> None:
    """Copy every tensor of ``weights`` into ``target``'s state, names matched as ``load_state_dict(strict=True)``.

    ``copy(name, tensor, weights)`` fills one live tensor with the part of ``weights[name]`` this process
    holds; ``global_shape`` is the whole shape of a live tensor (a shard's is smaller). A weight the files
    lack is an error unless it is the same tensor as one they hold (tied weights, written once); so are
    keys the module lacks and shapes that differ, all named before anything is copied.
    """
    state = target.state_dict(keep_vars=True)
    available = weights.names()
    present_ids = {id(tensor) for name, tensor in state.items() if name in available}
    missing = [name for name, tensor in state.items() if name not in available and id(tensor) not in present_ids]
    unexpected = sorted(available - set(state))
    mismatched = [
        f"{name} ({list(weights.shape(name))} in the files, {list(global_shape(tensor))} in the module)"
        for name, tensor in state.items()
        if name in available and weights.shape(name) != global_shape(tensor)
    ]
    problems = [
        f"{what}: {', '.join(names)}"
        for what, names in (
            ("missing from the files", missing),
            ("not in the module", unexpected),
            ("of another shape", mismatched),
        )
        if names
    ]
    if problems:
        raise ValueError(
            f"load_pretrained({str(weights.directory)!r}) does not fit {type(target).__name__}: {'; '.join(problems)}."
        )
    with torch.no_grad():
        for name, tensor in _each_once(state, available):
            copy(name, tensor, weights)


def copy_whole(name: str, tensor: torch.Tensor, weights: SafetensorsWeights) -> None:
    """Fill ``tensor`` with the whole of ``weights[name]``: for processes that hold whole tensors."""
    tensor.copy_(weights.read(name))


def _each_once(state: dict[str, torch.Tensor], available: set[str]) -> Iterator[tuple[str, torch.Tensor]]:
    done: set[int] = set()
    for name, tensor in state.items():
        if name in available and id(tensor) not in done:
            done.add(id(tensor))
            yield name, tensor
