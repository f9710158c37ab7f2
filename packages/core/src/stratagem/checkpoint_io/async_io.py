"""AsyncCheckpointIO: write checkpoints in a background thread while training continues."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
from torch.utils._pytree import tree_map

from stratagem.checkpoint_io.checkpoint_io import CheckpointIO, PathLike
from stratagem.checkpoint_io.torch_io import TorchCheckpointIO


class AsyncCheckpointIO(CheckpointIO):
    """Saves through another CheckpointIO (default: :class:`TorchCheckpointIO`) in one background thread.

    Called by rank 0 alone (:attr:`writes_collectively` is ``False``), so the IO it wraps must be too.

    ``save_checkpoint`` copies every tensor first (training goes on changing the live ones), then
    returns; the write happens in the thread. Writes and removals run in the order they were
    asked for, and once a write has failed no removal runs: the checkpoint it would have replaced
    (the previous of a top k, say) stays. An error in the thread is raised by the next call and by
    :meth:`teardown`, which also waits for pending writes; loading waits for them too.
    """

    def __init__(self, checkpoint_io: CheckpointIO | None = None) -> None:
        if checkpoint_io is not None and checkpoint_io.writes_collectively:
            # Its collectives would run in the background thread, interleaved with training's on the same group.
            raise ValueError(
                f"AsyncCheckpointIO(checkpoint_io={type(checkpoint_io).__name__}()) is not valid: that IO is called by "
                "every rank together (writes_collectively=True), which a background thread cannot do. Wrap an IO "
                "that rank 0 calls alone, such as TorchCheckpointIO."
            )
        self.checkpoint_io = checkpoint_io or TorchCheckpointIO()
        self._executor: ThreadPoolExecutor | None = None
        self._pending: list[Future[None]] = []
        self._write_failed = False

    def __getstate__(self) -> dict[str, Any]:
        # Threads do not cross process boundaries; a spawned worker starts its own.
        state = self.__dict__.copy()
        state.update(_executor=None, _pending=[], _write_failed=False)
        return state

    def save_checkpoint(self, checkpoint: dict[str, Any], path: PathLike) -> None:
        self._raise_failures()
        snapshot = tree_map(_copy_tensor, checkpoint)
        self._submit(self._write, snapshot, path)

    def load_checkpoint(
        self,
        path: PathLike,
        map_location: torch.device | str | None = "cpu",
        weights_only: bool = True,
    ) -> dict[str, Any]:
        self.wait()
        return self.checkpoint_io.load_checkpoint(path, map_location=map_location, weights_only=weights_only)

    def remove_checkpoint(self, path: PathLike) -> None:
        self._raise_failures()
        self._submit(self._remove, path)

    @classmethod
    def can_read(cls, path: PathLike) -> bool:
        return TorchCheckpointIO.can_read(path)

    def wait(self) -> None:
        """Block until every pending write and removal is done; raise the first error one of them raised."""
        pending, self._pending = self._pending, []
        errors = [error for future in pending if (error := future.exception()) is not None]
        if errors:
            raise RuntimeError(f"A background checkpoint write failed: {errors[0]}") from errors[0]

    def teardown(self) -> None:
        try:
            self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
            self._write_failed = False
            self.checkpoint_io.teardown()

    def _write(self, checkpoint: dict[str, Any], path: PathLike) -> None:
        try:
            self.checkpoint_io.save_checkpoint(checkpoint, path)
        except BaseException:
            # Set in the one writer thread before the removals queued behind this write run.
            self._write_failed = True
            raise

    def _remove(self, path: PathLike) -> None:
        # A removal was asked for on the assumption that the writes before it succeeded; the
        # write's own error is what wait() raises.
        if not self._write_failed:
            self.checkpoint_io.remove_checkpoint(path)

    def _submit(self, function: Any, *args: Any) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stratagem-checkpoint")
        self._pending.append(self._executor.submit(function, *args))

    def _raise_failures(self) -> None:
        if any(future.done() and future.exception() is not None for future in self._pending):
            self.wait()
        self._pending = [future for future in self._pending if not future.done()]


def _copy_tensor(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    return value
