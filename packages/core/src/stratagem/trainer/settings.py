"""The Trainer's loop options, checked at construction so that a bad value fails before anything runs."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal


@dataclass(frozen=True)
class TrainerSettings:
    max_epochs: int
    max_steps: int
    limit_train_batches: int | float
    limit_val_batches: int | float
    limit_test_batches: int | float
    limit_predict_batches: int | float
    val_check_interval: int | float
    check_val_every_n_epoch: int | None
    num_sanity_val_steps: int
    accumulate_grad_batches: int
    gradient_clip_val: float | None
    gradient_clip_algorithm: Literal["norm", "value"]
    default_root_dir: Path
    log_every_n_steps: int
    deterministic: bool
    seed: int | None
    use_distributed_sampler: bool


DEFAULT_MAX_EPOCHS = 1000
"""Used when neither ``max_epochs`` nor ``max_steps`` is given, as users of this kind of library expect."""

MAX_SEED = 2**63 - 1
"""The largest ``seed``: torch's generators take 64-bit seeds, and the distributed sampler adds the epoch to it."""


def parse_settings(
    *,
    max_epochs: Any,
    max_steps: Any,
    limit_train_batches: Any,
    limit_val_batches: Any,
    limit_test_batches: Any,
    limit_predict_batches: Any,
    val_check_interval: Any,
    check_val_every_n_epoch: Any,
    num_sanity_val_steps: Any,
    accumulate_grad_batches: Any,
    gradient_clip_val: Any,
    gradient_clip_algorithm: Any,
    default_root_dir: Any,
    log_every_n_steps: Any,
    deterministic: Any,
    seed: Any,
    use_distributed_sampler: Any,
) -> TrainerSettings:
    """Validate every loop option; raise ``ValueError``/``TypeError`` naming the option, the value and what fits."""
    _int(max_steps, "max_steps", minimum=-1, accepted="-1 (no limit) or a positive int")
    if max_steps == 0:
        raise ValueError("max_steps=0 is not valid; expected -1 (no limit) or a positive int.")
    if max_epochs is None:
        max_epochs = DEFAULT_MAX_EPOCHS if max_steps == -1 else -1
    else:
        _int(max_epochs, "max_epochs", minimum=-1, accepted="None, -1 (no limit) or an int >= 0")
    limits = {
        name: _limit(value, name)
        for name, value in (
            ("limit_train_batches", limit_train_batches),
            ("limit_val_batches", limit_val_batches),
            ("limit_test_batches", limit_test_batches),
            ("limit_predict_batches", limit_predict_batches),
        )
    }
    if isinstance(val_check_interval, bool) or not isinstance(val_check_interval, int | float):
        raise TypeError(
            f"val_check_interval={val_check_interval!r} is not valid; expected a fraction of an epoch in (0, 1] "
            "or a number of training batches (int >= 1)."
        )
    if isinstance(val_check_interval, float) and not 0.0 < val_check_interval <= 1.0:
        raise ValueError(
            f"val_check_interval={val_check_interval!r} is not valid; a fraction must be in (0, 1], or pass an int "
            "number of training batches."
        )
    if isinstance(val_check_interval, int) and val_check_interval < 1:
        raise ValueError(f"val_check_interval={val_check_interval!r} is not valid; expected an int >= 1 or a float.")
    if check_val_every_n_epoch is not None:
        _int(check_val_every_n_epoch, "check_val_every_n_epoch", minimum=1, accepted="None or a positive int")
    if check_val_every_n_epoch is None and not isinstance(val_check_interval, int):
        raise ValueError(
            f"check_val_every_n_epoch=None needs val_check_interval as a number of batches (an int), "
            f"got {val_check_interval!r}."
        )
    _int(num_sanity_val_steps, "num_sanity_val_steps", minimum=-1, accepted="-1 (all batches), 0 (off) or more")
    _int(accumulate_grad_batches, "accumulate_grad_batches", minimum=1, accepted="a positive int")
    if gradient_clip_val is not None:
        if isinstance(gradient_clip_val, bool) or not isinstance(gradient_clip_val, int | float):
            raise TypeError(f"gradient_clip_val={gradient_clip_val!r} is not valid; expected None or a number >= 0.")
        if gradient_clip_val < 0:
            raise ValueError(f"gradient_clip_val={gradient_clip_val!r} is not valid; expected None or a number >= 0.")
        gradient_clip_val = float(gradient_clip_val) or None
    if gradient_clip_algorithm not in ("norm", "value"):
        raise ValueError(
            f"gradient_clip_algorithm={gradient_clip_algorithm!r} is not valid; expected 'norm' or 'value'."
        )
    if default_root_dir is None:
        default_root_dir = os.getcwd()
    elif isinstance(default_root_dir, str | os.PathLike):
        check_writable_directory(Path(default_root_dir), "default_root_dir")
    else:
        raise TypeError(f"default_root_dir={default_root_dir!r} is not valid; expected a path (str or Path) or None.")
    _int(log_every_n_steps, "log_every_n_steps", minimum=1, accepted="a positive int")
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic={deterministic!r} is not valid; expected True or False.")
    if seed is not None:
        _int(seed, "seed", minimum=0, maximum=MAX_SEED, accepted="None or an int in [0, 2**63 - 1]")
    if not isinstance(use_distributed_sampler, bool):
        raise TypeError(f"use_distributed_sampler={use_distributed_sampler!r} is not valid; expected True or False.")
    return TrainerSettings(
        max_epochs=max_epochs,
        max_steps=max_steps,
        limit_train_batches=limits["limit_train_batches"],
        limit_val_batches=limits["limit_val_batches"],
        limit_test_batches=limits["limit_test_batches"],
        limit_predict_batches=limits["limit_predict_batches"],
        val_check_interval=val_check_interval,
        check_val_every_n_epoch=check_val_every_n_epoch,
        num_sanity_val_steps=num_sanity_val_steps,
        accumulate_grad_batches=accumulate_grad_batches,
        gradient_clip_val=gradient_clip_val,
        gradient_clip_algorithm=gradient_clip_algorithm,
        default_root_dir=Path(default_root_dir),
        log_every_n_steps=log_every_n_steps,
        deterministic=deterministic,
        seed=seed,
        use_distributed_sampler=use_distributed_sampler,
    )


def check_writable_directory(path: Path, option: str) -> None:
    """Refuse ``path`` unless it is a directory this process can write in, or one it can create.

    Checked when the option is given, so that a run does not spend its compute before the first save finds out.
    """
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing == path and not path.is_dir():
        raise ValueError(f"{option}={str(path)!r} is not valid: it exists and is not a directory. Give a directory.")
    if not existing.is_dir():
        raise ValueError(
            f"{option}={str(path)!r} is not valid: {str(existing)!r} is a file, so the directory cannot be created."
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "the directory" if existing == path else f"its closest existing parent {str(existing)!r}"
        raise ValueError(
            f"{option}={str(path)!r} is not writable: this process may not create files in {what} (its "
            "permissions, or a read-only file system). Give a directory you can write in; logs and checkpoints go "
            "there."
        )


def _int(value: Any, name: str, *, minimum: int, accepted: str, maximum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}={value!r} ({type(value).__name__}) is not valid; expected {accepted}.")
    if value < minimum or (maximum is not None and value > maximum):
        raise ValueError(f"{name}={value!r} is not valid; expected {accepted}.")


def _limit(value: Any, name: str) -> int | float:
    accepted = "a number of batches (int >= 0) or a fraction of the data (float in [0, 1])"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name}={value!r} ({type(value).__name__}) is not valid; expected {accepted}.")
    if (isinstance(value, int) and value < 0) or (isinstance(value, float) and not 0.0 <= value <= 1.0):
        raise ValueError(f"{name}={value!r} is not valid; expected {accepted}.")
    return value
