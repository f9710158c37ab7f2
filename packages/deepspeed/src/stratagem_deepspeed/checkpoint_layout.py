"""What a DeepSpeed checkpoint directory holds.

Layout (``<tag>`` is DeepSpeed's, e.g. ``global_step100``)::

    path/
      latest                      DeepSpeed: the tag to load
      <tag>/*_model_states.pt     DeepSpeed: module (rank 0, or one per rank at stage 3)
      <tag>/*_optim_states.pt     DeepSpeed: one optimizer shard per rank
      zero_to_fp32.py             DeepSpeed's offline consolidation script
      stratagem_state.pt          stratagem: the plain entries (loops, ...) and how the rest was saved

Nothing here imports deepspeed, so recognising a directory stays cheap.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from stratagem.checkpoint_io import CheckpointError, optional_checkpoint_file
from stratagem.printable import shown_repr

STATE_FILE = "stratagem_state.pt"
LATEST_FILE = "latest"
_MAX_TAG_BYTES = 255
"""The longest file name most file systems allow: DeepSpeed writes one tag name (``global_step10``) in ``latest``."""
METADATA_KEY = "__stratagem_deepspeed__"
"""Key in :data:`STATE_FILE` under which the strategy records how the checkpoint was saved."""


def is_deepspeed_checkpoint(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a directory written by DeepSpeed (``latest`` names a tag) or by this package."""
    directory = Path(path)
    if not directory.is_dir():
        return False
    return (directory / LATEST_FILE).is_file() or (directory / STATE_FILE).is_file()


def read_tag(directory: Path) -> str | None:
    """The tag ``latest`` names, or ``None`` when the directory has no DeepSpeed shards."""
    latest = optional_checkpoint_file(directory, LATEST_FILE)
    if latest is None:
        return None
    with latest.open("rb") as file:
        raw = file.read(_MAX_TAG_BYTES + 1)
    tag = raw.decode("utf-8", errors="backslashreplace").strip()
    name_like = len(raw) <= _MAX_TAG_BYTES and "\\" not in tag and tag.isprintable()
    if not name_like or tag in ("", ".", "..") or Path(tag).name != tag:
        # DeepSpeed writes a plain directory name; anything else would lead the reader outside the checkpoint.
        raise CheckpointError(f"{str(latest)!r} names {shown_repr(tag)}, not a tag directory inside the checkpoint.")
    if not (directory / tag).is_dir():
        raise CheckpointError(f"{str(latest)!r} names the tag {shown_repr(tag)}, but that directory is missing.")
    return tag


def shard_world_size(directory: Path, tag: str) -> int:
    """How many data-parallel ranks wrote the shards of ``tag`` (one optimizer file each)."""
    return len(list((directory / tag).glob("*zero_pp_rank_*_mp_rank_*_optim_states.pt"))) or 1


def write_state_file(directory: Path, state: dict[str, Any]) -> None:
    """Write ``state`` as :data:`STATE_FILE` in the temporary ``directory`` (``move_into_place`` fsyncs it)."""
    torch.save(state, directory / STATE_FILE)


@contextmanager
def removed_on_error(temporary: Path) -> Iterator[None]:
    """Remove the half-written ``temporary`` if the block fails."""
    try:
        yield
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
