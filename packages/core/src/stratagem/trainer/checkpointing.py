"""What a Trainer checkpoint holds, how a fit is restored from one, and what ``ckpt_path`` names."""

from __future__ import annotations

import functools
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stratagem.callbacks.model_checkpoint import ModelCheckpoint, default_checkpoint_root, find_last_checkpoint
from stratagem.checkpoint_io import CheckpointError
from stratagem.module_loading import HYPER_PARAMETERS_KEY, stored_hyperparameters
from stratagem.printable import printable
from stratagem.trainer.progress import FitProgress
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
    hyper_parameters = {HYPER_PARAMETERS_KEY: stored_hyperparameters(module.hparams)} if module.hparams else {}
    return {
        **hyper_parameters,
        "module": module,
        "optimizers": list(trainer.optimizers),
        "lr_schedulers": [config.scheduler.state_dict() for config in trainer.lr_scheduler_configs],
        "loops": {"fit": {**trainer.fit_progress.state_dict(), "epoch_start": trainer.epoch_start_state}},
        "rng": capture_rng_state(),
        "callbacks": {callback.state_key: callback.state_dict() for callback in trainer.callbacks},
        "precision": trainer.runtime.precision.state_dict(),
        "saved_by": saved_by(trainer),
        "format_version": FORMAT_VERSION,
        "stratagem_version": stratagem_version(),
    }


def saved_by(trainer: Trainer) -> dict[str, Any]:
    """How the run that saves is set up: shown when another setup resumes from its checkpoint."""
    return {
        "strategy": type(trainer.strategy).__name__,
        "precision": trainer.strategy.precision.name,
        "world_size": trainer.world_size,
    }


def announce_loaded(trainer: Trainer, path: str, checkpoint: dict[str, Any], what: str) -> None:
    """One line on global zero: which checkpoint was loaded, and how its run differed from this one."""
    if not trainer.is_global_zero:
        return
    line = f"stratagem: {what} {printable(path, 1000)}"
    # Only plain values of the expected kind are shown, control characters escaped: the file may come from anywhere.
    loops = checkpoint.get("loops")
    fit = loops.get("fit") if isinstance(loops, dict) else None
    if isinstance(fit, dict) and isinstance(fit.get("epoch"), int) and isinstance(fit.get("global_step"), int):
        line += f" (epoch {fit['epoch']}, step {fit['global_step']})"
    then, now = checkpoint.get("saved_by"), saved_by(trainer)
    if isinstance(then, dict):
        changed = [key for key, value in now.items() if isinstance(then.get(key), str | int) and then[key] != value]
        if changed:
            before = ", ".join(f"{key} {printable(then[key], 100)}" for key in changed)
            after = ", ".join(f"{key} {now[key]}" for key in changed)
            line += f"; it was saved with {before}, this run uses {after}"
    print(line, file=sys.stderr, flush=True)


def restore_fit(trainer: Trainer, module: Module, path: str, weights_only: bool) -> dict[str, Any]:
    """Load weights, optimizer, scheduler, precision, callback and loop state; return the checkpoint's
    remaining entries (the RNG state among them, applied by the fit loop when training starts)."""
    state: dict[str, Any] = {"module": module}
    if trainer.optimizers:
        state["optimizers"] = list(trainer.optimizers)
    remaining = trainer.runtime.load(path, state, weights_only=weights_only)
    check_trainer_entries(remaining, path)
    fit_state = _fit_state(remaining, path)
    schedulers = remaining.get("lr_schedulers", [])
    if len(schedulers) != len(trainer.lr_scheduler_configs):
        raise ValueError(
            f"ckpt_path={path!r} holds {len(schedulers)} lr scheduler state(s), but configure_optimizers() "
            f"created {len(trainer.lr_scheduler_configs)}."
        )
    for config, scheduler_state in zip(trainer.lr_scheduler_configs, schedulers):
        config.scheduler.load_state_dict(scheduler_state)
    if "precision" in remaining:
        trainer.runtime.precision.load_state_dict(remaining["precision"])
    callback_states = remaining.get("callbacks", {})
    for callback in trainer.callbacks:
        if callback.state_key in callback_states:
            callback.load_state_dict(callback_states[callback.state_key])
    if fit_state is not None:
        trainer.epoch_start_state = fit_state.pop("epoch_start", None)
        trainer.fit_progress.load_state_dict(fit_state)
    module.on_load_checkpoint(remaining)
    for callback in trainer.callbacks:
        callback.on_load_checkpoint(trainer, module, remaining)
    announce_loaded(trainer, path, remaining, "resuming from")
    return remaining


def restore_weights(trainer: Trainer, module: Module, path: str, weights_only: bool) -> None:
    """Load only the module's weights (for validate, test and predict)."""
    remaining = trainer.runtime.load(path, {"module": module}, weights_only=weights_only)
    check_trainer_entries(remaining, path)
    module.on_load_checkpoint(remaining)
    announce_loaded(trainer, path, remaining, "loaded the weights of")


def resolve_ckpt_path(trainer: Trainer, ckpt_path: Any, stage: str) -> str | None:
    """The checkpoint that ``ckpt_path`` (a path, ``"last"`` or ``"best"``) names, checked in the caller.

    ``"last"`` is the newest complete checkpoint where the Trainer's ModelCheckpoints save (with the
    default directory: of every run under ``<default_root_dir>/checkpoints``). With nothing saved yet
    a fit starts from scratch (with a warning), so that one command both starts and resumes a run.
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
        directories = list(
            dict.fromkeys(callback.search_directory(trainer.default_root_dir) for callback in checkpoint_callbacks)
        ) or [default_checkpoint_root(trainer.default_root_dir)]
        found = [last for directory in directories if (last := find_last_checkpoint(directory)) is not None]
        if not found:
            where = " or ".join(repr(str(directory)) for directory in directories)
            if stage != "fit":
                raise ValueError(f"ckpt_path='last' found no checkpoint under {where}.")
            warnings.warn(f"ckpt_path='last' found no checkpoint under {where}; training from scratch.", stacklevel=3)
            return None
        return str(max(found, key=lambda entry: entry.stat().st_mtime_ns))
    path = Path(ckpt_path)
    if not path.exists():
        raise FileNotFoundError(
            f"ckpt_path={str(ckpt_path)!r} does not exist; expected a checkpoint path, 'last' or 'best'."
        )
    return str(path)


_ENTRY_TYPES: dict[str, type] = {"lr_schedulers": list, "loops": dict, "callbacks": dict, "precision": dict}
"""The Trainer's own entries and what each must be, so that a malformed one is named rather than failing later."""


def check_trainer_entries(checkpoint: dict[str, Any], path: str) -> None:
    """A :class:`CheckpointError` naming ``path`` if one of the Trainer's entries has the wrong type, or
    ``format_version`` is not one this stratagem reads."""
    for key, expected in _ENTRY_TYPES.items():
        if key in checkpoint and not isinstance(checkpoint[key], expected):
            raise CheckpointError(
                f"{path!r} is not a stratagem checkpoint: its {key!r} entry is a {type(checkpoint[key]).__name__}, "
                f"not a {expected.__name__}."
            )
    version = checkpoint.get("format_version", FORMAT_VERSION)
    if not isinstance(version, int) or isinstance(version, bool):
        shown = repr(version) if isinstance(version, str | float | bool) and len(repr(version)) <= 40 else "not an int"
        raise CheckpointError(
            f"{path!r} has the format_version {shown}; a stratagem checkpoint has an int from 1 to {FORMAT_VERSION}."
        )
    if version > FORMAT_VERSION:
        raise CheckpointError(
            f"{path!r} has checkpoint format {version}, newer than this stratagem reads ({FORMAT_VERSION}); "
            "upgrade stratagem."
        )
    if version < 1:
        raise CheckpointError(
            f"{path!r} has the format_version {version}; stratagem checkpoints start at format 1 (this stratagem reads "
            f"1 to {FORMAT_VERSION})."
        )


def _fit_state(checkpoint: dict[str, Any], path: str) -> dict[str, Any] | None:
    """The checkpoint's fit-loop counters, checked before anything is restored from them: a negative step
    would resume a run that never reaches ``max_steps``."""
    if "loops" not in checkpoint:
        return None
    fit = checkpoint["loops"].get("fit")
    if not isinstance(fit, dict):
        raise CheckpointError(f"{path!r} is not a stratagem checkpoint: its 'loops' entry has no 'fit' dict.")
    fit_state = dict(fit)
    epoch_start = fit_state.pop("epoch_start", None)
    try:
        FitProgress().load_state_dict(fit_state)
    except ValueError as error:
        raise CheckpointError(f"{path!r} cannot be resumed: in its loop state ('loops' -> 'fit'), {error}.") from None
    return {**fit_state, "epoch_start": epoch_start}
