"""Saving at the next step boundary when the scheduler announces the end of the job (preemption, time limit)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from stratagem.callbacks.callback import Callback, RunStage
from stratagem.callbacks.model_checkpoint import CHECKPOINT_SUFFIX, default_checkpoint_root

if TYPE_CHECKING:
    from stratagem.module import Module
    from stratagem.trainer.trainer import Trainer

_Handler = Any  # what signal.signal returns: a callable, SIG_DFL, SIG_IGN or None


class Preemption(Callback):
    """On any of ``signals``, every rank saves a checkpoint at the next optimizer step boundary and fit returns.

    SLURM sends ``SIGTERM`` before it ends a job that is preempted or cancelled, and ``--signal=USR1@90``
    sends ``SIGUSR1`` 90 s before the time limit. The ranks decide together (a signal may reach them at
    different steps), so each step costs one small all-reduce while this callback is on. The checkpoint,
    ``preempted-step=<N>.ckpt``, goes where the first ModelCheckpoint saves (else ``<default_root_dir>/
    checkpoints``), so that ``fit(..., ckpt_path="last")`` resumes from it exactly. Under SLURM
    (``SLURM_JOB_ID`` set), global rank 0 then requeues the job with ``scontrol requeue`` unless
    ``requeue=False``.
    """

    def __init__(self, signals: Sequence[str] = ("SIGTERM", "SIGUSR1"), requeue: bool = True) -> None:
        names = [signals] if isinstance(signals, str) else list(signals)
        known = {name for name in dir(signal) if name.startswith("SIG") and not name.startswith("SIG_")}
        unknown = [name for name in names if name not in known or name in ("SIGKILL", "SIGSTOP")]
        if unknown or not names:
            raise ValueError(
                f"Preemption(signals={signals!r}): {', '.join(map(repr, unknown)) or 'none given'} cannot be "
                "caught; name signals such as 'SIGTERM', 'SIGUSR1', 'SIGUSR2', 'SIGINT'."
            )
        if not isinstance(requeue, bool):
            raise TypeError(f"Preemption(requeue={requeue!r}) is not valid; expected True or False.")
        self.signals = names
        self.requeue = requeue
        self.received: str | None = None
        self.saved_path: str | None = None
        self._previous: dict[int, _Handler] = {}
        self._last_step = -1

    @property
    def state_key(self) -> str:
        return f"Preemption{{signals={self.signals!r}}}"

    def on_train_start(self, trainer: Trainer, module: Module) -> None:
        self.received, self.saved_path = None, None
        self._last_step = trainer.global_step
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError(
                "Preemption handles signals, which Python delivers to the main thread only: run fit there."
            )
        for name in self.signals:
            number = getattr(signal, name)
            self._previous[number] = signal.signal(number, self._receive)

    def _receive(self, number: int, frame: FrameType | None) -> None:
        self.received = signal.Signals(number).name

    def on_train_batch_end(self, trainer: Trainer, module: Module, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if step == self._last_step:
            return  # inside an accumulation window: no whole step to save
        self._last_step = step
        if not trainer.strategy.reduce_boolean(self.received is not None, all_ranks=False):
            return
        callback = trainer.checkpoint_callback
        directory = (
            Path(callback.dirpath)
            if callback and callback.dirpath
            else default_checkpoint_root(trainer.default_root_dir)
        )
        path = directory / f"preempted-step={step}{CHECKPOINT_SUFFIX}"
        trainer.save_checkpoint(path)
        self.saved_path = str(path)
        trainer.should_stop = True
        if trainer.is_global_zero:
            why = self.received or "a signal on another rank"
            print(f"stratagem: {why}: saved {path} at step {step}; stopping.", file=sys.stderr, flush=True)
            job = os.environ.get("SLURM_JOB_ID")
            if self.requeue and job:
                self._requeue(job)

    @staticmethod
    def _requeue(job: str) -> None:
        try:
            result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as error:
            print(f"stratagem: scontrol requeue {job} failed: {error}", file=sys.stderr, flush=True)
            return
        outcome = "requeued" if result.returncode == 0 else f"scontrol requeue failed: {result.stderr.strip()}"
        print(f"stratagem: job {job} {outcome}", file=sys.stderr, flush=True)

    def teardown(self, trainer: Trainer, module: Module, stage: RunStage) -> None:
        for number, previous in self._previous.items():
            signal.signal(number, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}
