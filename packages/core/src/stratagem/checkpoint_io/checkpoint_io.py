"""The CheckpointIO interface: how a checkpoint's bytes reach storage and come back."""

from __future__ import annotations

import shutil
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import torch

PathLike = str | Path


class CheckpointIO(ABC):
    """Writes, reads and removes one checkpoint made of plain state (tensors, numbers, dicts).

    It never sees modules or optimizers: the strategy turns those into state first. Which
    processes call it is declared by :attr:`writes_collectively`, and a strategy that cannot
    call an IO that way refuses it when the run is resolved (see
    :meth:`~stratagem.strategies.Strategy.checkpoint_io_problem`).
    """

    writes_collectively: ClassVar[bool] = False
    """Who calls :meth:`save_checkpoint`.

    ``False``: one process, global rank 0, with the whole state; it must not use collectives.
    ``True``: every rank of the default process group at once, each with the state it holds
    (its shards), so the IO may use collectives; without a process group, the one process
    that calls it writes everything.

    Either way, :meth:`remove_checkpoint` is called by global rank 0 alone, and
    :meth:`load_checkpoint` and :meth:`can_read` by any process on its own.
    """

    @abstractmethod
    def save_checkpoint(self, checkpoint: dict[str, Any], path: PathLike) -> None:
        """Write ``checkpoint`` to ``path`` so that a reader never sees it half-written.

        A checkpoint already at ``path`` (a file, a directory or a link) stays until the new one is
        whole: write under :func:`~stratagem.checkpoint_io.temporary_sibling`, then
        :func:`~stratagem.checkpoint_io.move_into_place`. Callers never delete it first.
        """

    @abstractmethod
    def load_checkpoint(
        self,
        path: PathLike,
        map_location: torch.device | str | None = "cpu",
        weights_only: bool = True,
    ) -> dict[str, Any]:
        """Read the checkpoint at ``path``. ``weights_only=False`` allows arbitrary pickles.

        An entry that is costly to assemble and that many callers never take (optimizer state
        gathered from shards, which evaluation does not use) may be deferred: return a
        :class:`~stratagem.checkpoint_io.LazyCheckpoint` and :meth:`~stratagem.checkpoint_io.LazyCheckpoint.defer`
        it. Whatever is wrong with a deferred entry is then raised when it is taken.
        """

    def remove_checkpoint(self, path: PathLike) -> None:
        """Delete the checkpoint at ``path`` (a file or a directory); nothing there is not an error.

        Override for checkpoints that are not files on this file system (an object store, say).
        """
        target = Path(path)
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)

    @classmethod
    def can_read(cls, path: PathLike) -> bool:
        """Whether this IO recognises the checkpoint at ``path`` by its layout.

        Lets a strategy load a checkpoint that another strategy wrote (a directory of shards
        read by a single-device run, say): registered checkpoint IOs are asked in turn.
        """
        return False

    def teardown(self) -> None:
        """Finish pending writes and release resources; raise what a background write raised."""
