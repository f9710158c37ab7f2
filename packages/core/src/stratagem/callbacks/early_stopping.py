"""EarlyStopping: stop fitting when a monitored metric stops improving."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

from stratagem.callbacks.callback import Callback

if TYPE_CHECKING:
    from stratagem.module import Module
    from stratagem.trainer.trainer import Trainer


class EarlyStopping(Callback):
    """Stop when ``monitor`` has not improved by more than ``min_delta`` for ``patience`` validations.

    Also stops at once when the metric is not finite (``check_finite``), reaches
    ``stopping_threshold`` (good enough) or crosses ``divergence_threshold`` (hopeless).
    Checked after every validation pass of a fit; global zero decides, so every rank stops
    at the same step. ``strict=True`` raises when the metric was never logged.
    """

    def __init__(
        self,
        monitor: str,
        min_delta: float = 0.0,
        patience: int = 3,
        mode: Literal["min", "max"] = "min",
        strict: bool = True,
        check_finite: bool = True,
        stopping_threshold: float | None = None,
        divergence_threshold: float | None = None,
    ) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"EarlyStopping(mode={mode!r}) is not valid; use 'min' or 'max'.")
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 0:
            raise ValueError(f"EarlyStopping(patience={patience!r}) is not valid; use an int >= 0.")
        if min_delta < 0:
            raise ValueError(f"EarlyStopping(min_delta={min_delta!r}) is not valid; use a number >= 0.")
        self.monitor = monitor
        self.min_delta = float(min_delta)
        self.patience = patience
        self.mode = mode
        self.strict = strict
        self.check_finite = check_finite
        self.stopping_threshold = stopping_threshold
        self.divergence_threshold = divergence_threshold
        self.wait_count = 0
        self.best_score = math.inf if mode == "min" else -math.inf
        self.stopped_epoch = -1
        self.stopping_reason = ""

    @property
    def state_key(self) -> str:
        return f"EarlyStopping{{monitor={self.monitor!r}, mode={self.mode!r}}}"

    def on_validation_end(self, trainer: Trainer, module: Module) -> None:
        if trainer.sanity_checking or trainer.stage != "fit":
            return
        decision = self._decide(trainer) if trainer.is_global_zero else None
        wait_count, best_score, reason = trainer.strategy.broadcast(decision)
        self.wait_count, self.best_score = wait_count, best_score
        if reason:
            self.stopping_reason = reason
            self.stopped_epoch = trainer.current_epoch
            trainer.should_stop = True

    def _decide(self, trainer: Trainer) -> tuple[int, float, str]:
        value = trainer.callback_metrics.get(self.monitor)
        if value is None:
            if self.strict:
                available = ", ".join(sorted(trainer.callback_metrics)) or "none"
                raise RuntimeError(
                    f"EarlyStopping(monitor={self.monitor!r}) found no such metric after validation (logged: "
                    f"{available}). Log it in validation_step, or pass strict=False."
                )
            return self.wait_count, self.best_score, ""
        score = float(value)
        better = (lambda a, b: a < b) if self.mode == "min" else (lambda a, b: a > b)
        if self.check_finite and not math.isfinite(score):
            return self.wait_count, self.best_score, f"{self.monitor} = {score} is not finite"
        # NaN is the worst value there is (check_finite=False lets it through): never good enough, never better than
        # the best, and it never becomes the best (compared as it is, it would reach any stopping_threshold).
        if math.isnan(score):
            return self._no_improvement()
        if self.stopping_threshold is not None and not better(self.stopping_threshold, score):
            return self.wait_count, score, f"{self.monitor} = {score:.6g} reached stopping_threshold"
        if self.divergence_threshold is not None and better(self.divergence_threshold, score):
            return self.wait_count, self.best_score, f"{self.monitor} = {score:.6g} crossed divergence_threshold"
        shifted = score + self.min_delta if self.mode == "min" else score - self.min_delta
        if better(shifted, self.best_score) or math.isnan(self.best_score):
            return 0, score, ""
        return self._no_improvement()

    def _no_improvement(self) -> tuple[int, float, str]:
        wait_count = self.wait_count + 1
        if wait_count >= self.patience:
            return (
                wait_count,
                self.best_score,
                f"{self.monitor} did not improve for {wait_count} validations (best {self.best_score:.6g})",
            )
        return wait_count, self.best_score, ""

    def state_dict(self) -> dict[str, Any]:
        return {
            "wait_count": self.wait_count,
            "best_score": self.best_score,
            "stopped_epoch": self.stopped_epoch,
            "patience": self.patience,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.wait_count = int(state["wait_count"])
        self.best_score = float(state["best_score"])
        self.stopped_epoch = int(state["stopped_epoch"])
