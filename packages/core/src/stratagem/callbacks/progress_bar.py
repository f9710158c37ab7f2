"""ProgressBar: training progress on the global-zero process.

On a terminal it draws a tqdm bar with the loss, ``prog_bar`` metrics, steps/s and ETA. When
the output is not a terminal (CI, a log file), or a terminal too narrow to draw a bar in (some
containers report 0 columns), it prints one short line at intervals instead of redrawing.
Metrics are read (one device sync) only when the display refreshes.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

from stratagem.callbacks.callback import Callback

if TYPE_CHECKING:
    from tqdm import tqdm

    from stratagem.module import Module
    from stratagem.trainer.trainer import Trainer


class ProgressBar(Callback):
    """Shows progress on global zero. ``refresh_seconds`` is how often the bar redraws on a
    terminal; ``print_seconds`` how often a line is printed otherwise. ``stream`` defaults to
    standard output."""

    def __init__(self, refresh_seconds: float = 0.5, print_seconds: float = 5.0, stream: TextIO | None = None) -> None:
        if refresh_seconds <= 0 or print_seconds <= 0:
            raise ValueError(
                f"ProgressBar(refresh_seconds={refresh_seconds}, print_seconds={print_seconds}) needs positive values."
            )
        self.refresh_seconds = refresh_seconds
        self.print_seconds = print_seconds
        self._stream = stream
        self._bar: tqdm | None = None
        self._active = False
        self._next_refresh = float("inf")
        self._start_time = 0.0
        self._start_step = 0
        self._total: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        # A spawned worker gets its own bar and its own standard output.
        state = self.__dict__.copy()
        state.update(_bar=None, _stream=None if self._stream in (sys.stdout, sys.stderr) else self._stream)
        return state

    @property
    def stream(self) -> TextIO:
        return self._stream or sys.stdout

    @property
    def interactive(self) -> bool:
        isatty = getattr(self.stream, "isatty", None)
        return bool(isatty and isatty()) and _terminal_columns(self.stream) >= _MIN_BAR_COLUMNS

    # -- training ---------------------------------------------------------------------------------

    def on_train_start(self, trainer: Trainer, module: Module) -> None:
        self._active = trainer.is_global_zero
        if not self._active:
            return
        self._start_time = time.perf_counter()
        self._start_step = trainer.global_step
        self._total = trainer.estimated_total_steps
        if self.interactive:
            from tqdm import tqdm

            # tqdm puts ", " before a postfix itself.
            self._bar = tqdm(
                total=self._total,
                initial=self._start_step,
                desc=f"epoch {trainer.current_epoch}",
                unit="step",
                file=self.stream,
                dynamic_ncols=True,
                leave=True,
                bar_format="{desc} {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt}{postfix}",
            )
            self._next_refresh = self._start_time + self.refresh_seconds
        else:
            self._next_refresh = self._start_time + self.print_seconds

    def on_train_batch_end(self, trainer: Trainer, module: Module, outputs: Any, batch: Any, batch_idx: int) -> None:
        if not self._active:
            return
        now = time.perf_counter()
        if now >= self._next_refresh:
            self._show(trainer, now)

    def on_train_end(self, trainer: Trainer, module: Module) -> None:
        if not self._active:
            return
        now = time.perf_counter()
        self._show(trainer, now)
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        steps = trainer.global_step - self._start_step
        elapsed = max(now - self._start_time, 1e-9)
        metrics = _format_metrics(trainer.progress_bar_metrics)
        self._write(f"trained {steps} steps in {elapsed:.1f} s ({steps / elapsed:.1f} steps/s){metrics}")
        self._active = False

    def _show(self, trainer: Trainer, now: float) -> None:
        step = trainer.global_step
        elapsed = max(now - self._start_time, 1e-9)
        rate = (step - self._start_step) / elapsed
        eta = (self._total - step) / rate if self._total is not None and rate > 0 else None
        metrics = trainer.progress_bar_metrics
        if self._bar is not None:
            self._bar.set_description_str(f"epoch {trainer.current_epoch}", refresh=False)
            postfix = ", ".join(f"{name}={value:.4g}" for name, value in metrics.items())
            timing = f"{rate:.1f} steps/s" + (f", ETA {_duration(eta)}" if eta is not None else "")
            self._bar.set_postfix_str(f"{postfix} [{timing}]" if postfix else f"[{timing}]", refresh=False)
            self._bar.update(step - self._bar.n)
            self._next_refresh = now + self.refresh_seconds
        else:
            total = f"/{self._total}" if self._total is not None else ""
            timing = f" | {rate:.1f} steps/s" + (f" | ETA {_duration(eta)}" if eta is not None else "")
            self._write(f"epoch {trainer.current_epoch} | step {step}{total}{_format_metrics(metrics)}{timing}")
            self._next_refresh = now + self.print_seconds

    # -- evaluation -------------------------------------------------------------------------------

    def on_validation_end(self, trainer: Trainer, module: Module) -> None:
        if trainer.is_global_zero and not trainer.sanity_checking:
            self._report(trainer, "validation")

    def on_test_end(self, trainer: Trainer, module: Module) -> None:
        if trainer.is_global_zero:
            self._report(trainer, "test")

    def _report(self, trainer: Trainer, what: str) -> None:
        metrics = trainer.last_evaluation_metrics
        if metrics:
            where = f" (epoch {trainer.current_epoch}, step {trainer.global_step})" if trainer.stage == "fit" else ""
            self._write(f"{what}{where}:{_format_metrics(metrics, separator=' ')}")

    def _write(self, line: str) -> None:
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)


_MIN_BAR_COLUMNS = 40
"""Narrower than this, a bar with its counts and metrics would wrap on every redraw."""


def _terminal_columns(stream: TextIO) -> int:
    """The stream's terminal width, else ``COLUMNS``; 0 when neither says (unknown is not wide)."""
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        columns = 0
    if columns:
        return columns
    fallback = os.environ.get("COLUMNS", "")
    return int(fallback) if fallback.isdigit() else 0


def _format_metrics(metrics: dict[str, float], separator: str = " | ") -> str:
    if not metrics:
        return ""
    return separator + " ".join(f"{name}={value:.4g}" for name, value in metrics.items())


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
