"""What a Trainer checkpoint holds, how a fit is restored from one, and what ``ckpt_path`` names."""

from __future__ import annotations

import functools
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stratagem.callbacks.model_checkpoint import ModelCheckpoint, find_last_checkpoint
from stratagem.module_loading import HYPER_PARAMETERS_KEY
from stratagem.trainer.rng import capture_rng_state

if TYPE_CHECKING:
    from stratagem.module import Module
    from stratagem.trainer.trainer import Trainer

FORMAT_VERSION = 1
"""Bumped when the layout of a checkpoint changes in a way older readers cannot follow."""


@functools.cache
def stratagem_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("stratagem")
    except PackageNotFoundError:
        return "unknown"


def build_checkpoint(trainer: Trainer, module: Module) -> dict[str, Any]:
    """The state to hand to ``strategy.save_checkpoint``: live module and optimizers, plain values for the rest."""
    # Only when saved: Module.load_from_checkpoint rebuilds the module from them.
    hyper_parameters = {HYPER_PARAMETERS_KEY: dict(module.hparams)} if module.hparams else {}
    return {
        **hyper_parameters,
        "module": module,
        "optimizers": list(trainer.optimizers),
        "lr_schedulers": [config.scheduler.state_dict() for config in trainer.lr_scheduler_configs],
        "loops": {"fit": {**trainer.fit_progress.state_dict(), "epoch_start": trainer.epoch_start_state}},
        "rng": capture_rng_state(),
        "callbacks": {callback.state_key: callback.state_dict() for callback in trainer.callbacks},
        "precision": trainer.strategy.precision.state_dict(),
        "format_version": FORMAT_VERSION,
        "stratagem_version": stratagem_version(),
    }


def restore_fit(trainer: Trainer, module: Module, path: str, weights_only: bool) -> dict[str, Any]:
    """Load weights, optimizer, scheduler, precision, callback and loop state; return the checkpoint's
    remaining entries (the RNG state among them, applied by the fit loop when training starts)."""
    state: dict[str, Any] = {"module": module}
    if trainer.optimizers:
        state["optimizers"] = list(trainer.optimizers)
    remaining = trainer.strategy.load_checkpoint(path, state, weights_only=weights_only)
    _check_format(remaining, path)
    schedulers = remaining.get("lr_schedulers", [])
    if len(schedulers) != len(trainer.lr_scheduler_configs):
        raise ValueError(
            f"ckpt_path={path!r} holds {len(schedulers)} lr scheduler state(s), but configure_optimizers() "
            f"created {len(trainer.lr_scheduler_configs)}."
        )
    for config, scheduler_state in zip(trainer.lr_scheduler_configs, schedulers):
        config.scheduler.load_state_dict(scheduler_state)
    if "precision" in remaining:
        trainer.strategy.precision.load_state_dict(remaining["precision"])
    callback_states = remaining.get("callbacks", {})
    for callback in trainer.callbacks:
        if callback.state_key in callback_states:
            callback.load_state_dict(callback_states[callback.state_key])
    if "loops" in remaining:
        fit_state = dict(remaining["loops"]["fit"])
        trainer.epoch_start_state = fit_state.pop("epoch_start", None)
        trainer.fit_progress.load_state_dict(fit_state)
    module.on_load_checkpoint(remaining)
    for callback in trainer.callbacks:
        callback.on_load_checkpoint(trainer, module, remaining)
    return remaining


def restore_weights(trainer: Trainer, module: Module, path: str, weights_only: bool) -> None:
    """Load only the module's weights (for validate, test and predict)."""
    remaining = trainer.strategy.load_checkpoint(path, {"module": module}, weights_only=weights_only)
    _check_format(remaining, path)
    module.on_load_checkpoint(remaining)


def resolve_ckpt_path(trainer: Trainer, ckpt_path: Any, stage: str) -> str | None:
    """The checkpoint that ``ckpt_path`` (a path, ``"last"`` or ``"best"``) names, checked in the caller.

    ``"last"`` with nothing saved yet starts a fit from scratch (with a warning), so that one
    command both starts and resumes a run.
    """
    if ckpt_path is None:
        return None
    if not isinstance(ckpt_path, str | Path):
        raise TypeError(f"ckpt_path={ckpt_path!r} is not valid; expected a path, 'last', 'best' or None.")
    checkpoint_callbacks = [callback for callback in trainer.callbacks if isinstance(callback, ModelCheckpoint)]
    if ckpt_path == "best":
        monitored = [callback for callback in checkpoint_callbacks if callback.monitor is not None]
        best = next((callback.best_model_path for callback in monitored if callback.best_model_path), "")
        if not best:
            raise ValueError(
                "ckpt_path='best' needs a ModelCheckpoint(monitor=...) that has saved a checkpoint in this Trainer; "
                "pass a path instead."
            )
        return best
    if ckpt_path == "last":
        last = _find_last(trainer, checkpoint_callbacks)
        if last is None:
            if stage != "fit":
                raise ValueError(f"ckpt_path='last' found no checkpoint under {str(_default_dir(trainer))!r}.")
            warnings.warn(
                f"ckpt_path='last' found no checkpoint under {str(_default_dir(trainer))!r}; training from scratch.",
                stacklevel=3,
            )
            return None
        return str(last)
    path = Path(ckpt_path)
    if not path.exists():
        raise FileNotFoundError(
            f"ckpt_path={str(ckpt_path)!r} does not exist; expected a checkpoint path, 'last' or 'best'."
        )
    return str(path)


def _find_last(trainer: Trainer, callbacks: list[ModelCheckpoint]) -> Path | None:
    for callback in callbacks:
        if callback.last_model_path and Path(callback.last_model_path).exists():
            return Path(callback.last_model_path)
    directories = [callback.dirpath for callback in callbacks if callback.dirpath is not None]
    directories = directories or [_default_dir(trainer)]
    found = [last for directory in directories if (last := find_last_checkpoint(directory)) is not None]
    return max(found, key=lambda entry: entry.stat().st_mtime_ns, default=None)


def _default_dir(trainer: Trainer) -> Path:
    return Path(trainer.default_root_dir) / "checkpoints"


def _check_format(checkpoint: dict[str, Any], path: str) -> None:
    version = checkpoint.get("format_version", FORMAT_VERSION)
    if version > FORMAT_VERSION:
        raise ValueError(
            f"{path!r} has checkpoint format {version}, newer than this stratagem reads ({FORMAT_VERSION}); "
            "upgrade stratagem."
        )
