"""Sharded checkpoints written in the background through DCP's ``async_save`` while training continues."""

from __future__ import annotations

import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException, FileSystemWriter
from torch.utils._pytree import tree_map

from stratagem.checkpoint_io import PathLike, move_into_place
from stratagem.checkpoint_io.sharded import PLAIN_STATE_FILE, DistributedCheckpointIO, is_sharded_state
from stratagem.checkpoint_io.staging import ProcessGroupRanks, staging_directory


class AsyncDistributedCheckpointIO(DistributedCheckpointIO):
    """:class:`DistributedCheckpointIO` whose writes go on in the background (``plugins="async"`` with fsdp).

    ``save_checkpoint`` copies each rank's shards to CPU memory (DCP's staging) and returns; each rank
    writes them in a background thread, whose collectives run on a Gloo group of their own so that
    they never interleave with training's. Once all are written, rank 0 adds the plain entries, gives
    the directory its name and tells every rank's thread how that went. Rank 0's thread then runs the
    removals asked for after the save (the checkpoints a new one replaces in a top k), and none after a
    failed one. One save is in flight at a time: the next ``save_checkpoint`` waits for the previous
    one, and it, like :meth:`teardown` (which ends every run) and loading, raises on every rank what
    failed on any, without a collective of its own (teardown also runs after a rank failed).
    """

    def __init__(self) -> None:
        self._group: dist.ProcessGroup | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._pending: list[Future[Any]] = []
        self._write_failed = False

    def __getstate__(self) -> dict[str, Any]:
        # Threads and process groups do not cross process boundaries; a spawned worker makes its own.
        state = self.__dict__.copy()
        state.update(_group=None, _executor=None, _pending=[], _write_failed=False)
        return state

    def save_checkpoint(self, checkpoint: dict[str, Any], path: PathLike) -> None:
        self.wait()
        if not ProcessGroupRanks.grouped():
            # One process: nothing to overlap with collectives, and nobody else to tell of a failure later.
            super().save_checkpoint(checkpoint, path)
            return
        target = Path(path)
        # New containers: the optimizer's param_groups may change while the thread pickles them.
        sharded = tree_map(lambda value: value, {key: v for key, v in checkpoint.items() if is_sharded_state(v)})
        plain = {key: value for key, value in checkpoint.items() if key not in sharded}
        is_writer = dist.get_rank() == 0
        staging = staging_directory(target, ProcessGroupRanks())
        group = self._own_group()
        try:
            written = dcp.async_save(sharded, storage_writer=FileSystemWriter(staging), process_group=group)
        except BaseException:
            if is_writer:
                shutil.rmtree(staging, ignore_errors=True)
            raise
        snapshot = tree_map(_copy_tensor, plain) if is_writer else None
        self._submit(self._publish, written, snapshot, staging, target)

    def remove_checkpoint(self, path: PathLike) -> None:
        if self._executor is None:
            super().remove_checkpoint(path)
            return
        self._submit(self._remove, path)

    def load_checkpoint(
        self,
        path: PathLike,
        map_location: torch.device | str | None = "cpu",
        weights_only: bool = True,
    ) -> dict[str, Any]:
        self.wait()
        return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)

    def load_into(
        self, path: PathLike, template: dict[str, Any], strict: bool = True, weights_only: bool = True
    ) -> dict[str, Any]:
        self.wait()
        return super().load_into(path, template, strict, weights_only)

    def wait(self) -> None:
        """Block until this rank's pending writes and removals are done; raise the first error of one of them."""
        pending, self._pending = self._pending, []
        errors = [error for future in pending if (error := future.exception()) is not None]
        self._write_failed = False
        if errors:
            raise errors[0]

    def teardown(self) -> None:
        try:
            self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
            if self._group is not None and ProcessGroupRanks.grouped():
                dist.destroy_process_group(self._group)
            self._group = None

    def _own_group(self) -> dist.ProcessGroup:
        if self._group is None:
            self._group = dist.new_group(backend="gloo")
        return self._group

    def _publish(self, written: Future[Any], plain: dict[str, Any] | None, staging: Path, target: Path) -> None:
        """In this rank's background thread: wait for its writes; rank 0 completes the directory; all learn how."""
        failure = None
        try:
            # Returns once every rank's shards and the metadata are written (or raises what failed on any rank).
            written.result()
            if plain is not None:
                torch.save(plain, staging / PLAIN_STATE_FILE)
                move_into_place(staging, target)
        except BaseException as error:
            failure = _describe(error)
            if plain is not None:
                shutil.rmtree(staging, ignore_errors=True)
        verdict = [failure]
        dist.broadcast_object_list(verdict, src=0, group=self._group)
        if verdict[0] is not None:
            # Set in rank 0's one background thread, before the removals queued behind this write run.
            self._write_failed = True
            raise RuntimeError(
                f"Writing the checkpoint {str(target)!r} in the background failed: {verdict[0]}. The checkpoints it "
                "was to replace were kept."
            )

    def _remove(self, path: PathLike) -> None:
        if not self._write_failed:
            super().remove_checkpoint(path)

    def _submit(self, function: Any, *args: Any) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stratagem-dcp-publish")
        self._pending.append(self._executor.submit(function, *args))


def _describe(error: BaseException) -> str:
    """The error in one line; DCP's own names each failed rank's error (its text carries whole tracebacks)."""
    if isinstance(error, CheckpointException):
        causes = {
            rank: failure[0] if isinstance(failure, tuple) else failure for rank, failure in error.failures.items()
        }
        return "; ".join(f"{type(cause).__name__}: {cause} (writing on rank {rank})" for rank, cause in causes.items())
    return f"{type(error).__name__}: {error}"


def _copy_tensor(value: Any) -> Any:
    return value.detach().to("cpu", copy=True) if isinstance(value, torch.Tensor) else value
