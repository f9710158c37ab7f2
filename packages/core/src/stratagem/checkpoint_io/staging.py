"""How the ranks of a run write one checkpoint directory together, so that it appears whole or not at all.

1. Rank 0 makes a fresh directory beside the target; every rank learns its name.
2. Every rank writes its part into it (a call that may itself be collective, as ``dcp.save`` is).
3. Every rank learns whether every rank's part was written.
4. Rank 0 completes the directory (the entries it alone writes), then gives it the target's name; every
   rank learns how that went.

A failure at any step removes the staged directory and raises on every rank: the failing rank raises its
own error, the others say which step failed where. A checkpoint already at the target is replaced only in
step 4, by a rename, and is intact after any failure.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch.distributed as dist

from stratagem.checkpoint_io.atomic import move_into_place, temporary_sibling


class CheckpointRanks(Protocol):
    """The ranks writing one checkpoint, and the three exchanges the protocol needs; every ``Strategy`` is one."""

    @property
    def is_global_zero(self) -> bool: ...

    def broadcast(self, obj: Any, src: int = 0) -> Any: ...

    def reduce_boolean(self, decision: bool, all_ranks: bool = True) -> bool: ...

    def write_on_rank_zero(self, write: Callable[[], None], description: str) -> None: ...


class ProcessGroupRanks:
    """The ranks of torch.distributed's default group; one process when no group of several is initialised.

    For a checkpoint IO, which is called without its strategy: object collectives pick the group's device
    themselves (gloo on CPU, NCCL on the current GPU).
    """

    @staticmethod
    def grouped() -> bool:
        """Whether a default process group of more than one rank is initialised."""
        return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1

    @property
    def is_global_zero(self) -> bool:
        return not self.grouped() or dist.get_rank() == 0

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if not self.grouped():
            return obj
        holder = [obj]
        dist.broadcast_object_list(holder, src=src)
        return holder[0]

    def reduce_boolean(self, decision: bool, all_ranks: bool = True) -> bool:
        if not self.grouped():
            return decision
        decisions: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(decisions, decision)
        return all(decisions) if all_ranks else any(decisions)

    def write_on_rank_zero(self, write: Callable[[], None], description: str) -> None:
        rank_zero_writes(self, write, description)


def rank_zero_writes(ranks: CheckpointRanks, write: Callable[[], None], description: str) -> None:
    """Run ``write`` on rank 0 alone; every rank raises when it failed (rank 0 its own error, the others naming
    ``description``). The broadcast also holds the other ranks until rank 0 is done, so what it wrote is there for
    all once this returns."""
    failure: BaseException | None = None
    if ranks.is_global_zero:
        try:
            write()
        except BaseException as error:
            failure = error
    outcome = ranks.broadcast(None if failure is None else f"{type(failure).__name__}: {failure}")
    if failure is not None:
        raise failure
    if outcome is not None:
        raise RuntimeError(f"{description} failed on rank 0: {outcome}")


def write_staged(
    target: Path,
    ranks: CheckpointRanks,
    write_part: Callable[[Path], None],
    complete: Callable[[Path], None] | None = None,
) -> None:
    """Write the checkpoint directory ``target`` by the steps above: ``write_part(staging)`` on every rank,
    then ``complete(staging)`` on rank 0. Called on every rank."""
    staging = staging_directory(target, ranks)
    failure: BaseException | None = None
    try:
        write_part(staging)
    except BaseException as error:
        failure = _explained(target, error)
    if not ranks.reduce_boolean(failure is None, all_ranks=True):
        if ranks.is_global_zero:
            shutil.rmtree(staging, ignore_errors=True)
        if failure is not None:
            raise failure
        raise RuntimeError(
            f"Writing the checkpoint {str(target)!r} failed on another rank (its error is raised there). Nothing "
            "was replaced: a checkpoint already at that path is intact, and the partial files were removed."
        )

    def publish() -> None:
        try:
            if complete is not None:
                complete(staging)
            # move_into_place fsyncs every file of the directory before it takes the name.
            move_into_place(staging, target)
        except BaseException as error:
            shutil.rmtree(staging, ignore_errors=True)
            explained = _explained(target, error)
            if explained is error:
                raise
            raise explained from error

    ranks.write_on_rank_zero(publish, f"Writing the checkpoint {str(target)!r}")


def staging_directory(target: Path, ranks: CheckpointRanks) -> Path:
    """A fresh directory beside ``target``, made by rank 0; every rank gets its name (step 1)."""
    made: tuple[str, str | None] | None = None
    failure: BaseException | None = None
    if ranks.is_global_zero:
        staging = temporary_sibling(target)
        try:
            staging.mkdir(parents=True)
        except OSError as error:
            failure = _explained(target, error)
        made = (str(staging), None if failure is None else f"{type(failure).__name__}: {failure}")
    name, problem = ranks.broadcast(made)
    if failure is not None:
        raise failure
    if problem is not None:
        raise RuntimeError(f"Writing the checkpoint {str(target)!r} failed on rank 0: {problem}")
    return Path(name)


def write_failure(target: Path, error: BaseException) -> OSError | None:
    """An ``OSError`` saying that writing the checkpoint ``target`` failed, and why, when ``error`` is an
    ``OSError`` with an errno (or a failure DCP gathered from the ranks holds one); ``None`` otherwise."""
    cause = _os_error(error)
    if cause is None or cause.errno is None:
        return None
    where = f" while writing {cause.filename!r}" if cause.filename else ""
    reason = (
        "the disk is full (ENOSPC: no space left on device)"
        if cause.errno == errno.ENOSPC
        else f"{cause.strerror} ({errno.errorcode.get(cause.errno, cause.errno)})"
    )
    return OSError(
        cause.errno,
        f"Writing the checkpoint {str(target)!r} failed: {reason}{where}. Nothing was replaced: a checkpoint "
        "already at that path is intact, and the partial files were removed.",
    )


def _explained(target: Path, error: BaseException) -> BaseException:
    explained = write_failure(target, error)
    if explained is None:
        return error
    explained.__cause__ = error
    return explained


def _os_error(error: BaseException) -> OSError | None:
    causes: list[Any] = [error]
    # torch.distributed.checkpoint's CheckpointException gathers each rank's failure in ``failures``.
    failures = getattr(error, "failures", None)
    if isinstance(failures, dict):
        causes += [failure[0] if isinstance(failure, tuple) else failure for failure in failures.values()]
    return next((item for item in causes if isinstance(item, OSError) and item.errno is not None), None)
