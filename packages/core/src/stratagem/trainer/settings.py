"""The Trainer's loop options, checked at construction so that a bad value fails before anything runs."""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, get_args

NonFinite = Literal["error", "skip", "ignore"]
"""What a training step with a non-finite loss or gradient norm does: stop the run (``"error"``), be skipped on
every rank (``"skip"``), or train on (``"ignore"``)."""


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
    nonfinite: NonFinite
    max_time: timedelta | None
    fast_dev_run: int
    """Batches per pass of a quick check run (``0``: off)."""


SETTING_NAMES = frozenset(field.name for field in fields(TrainerSettings))
"""The Trainer's loop options: the keyword arguments of ``Trainer.__init__`` that :func:`parse_settings` checks."""

LIMIT_NAMES = ("limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches")

DEFAULT_MAX_EPOCHS = 1000
"""Used when neither ``max_epochs`` nor ``max_steps`` is given, as users of this kind of library expect."""

MAX_SEED = 2**63 - 1
"""The largest ``seed``: torch's generators take 64-bit seeds, and the distributed sampler adds the epoch to it."""


def parse_settings(options: Mapping[str, Any]) -> TrainerSettings:
    """Validate every loop option; raise ``ValueError``/``TypeError`` naming the option, the value and what fits.

    ``options`` maps each of :data:`SETTING_NAMES` to the value the Trainer was given (its defaults included).
    """
    missing, extra = SETTING_NAMES - set(options), set(options) - SETTING_NAMES
    if missing or extra:
        raise TypeError(f"parse_settings() needs exactly the Trainer's loop options; missing {missing}, extra {extra}.")
    max_epochs, max_steps = options["max_epochs"], options["max_steps"]
    val_check_interval = options["val_check_interval"]
    check_val_every_n_epoch = options["check_val_every_n_epoch"]
    gradient_clip_val, gradient_clip_algorithm = options["gradient_clip_val"], options["gradient_clip_algorithm"]
    default_root_dir = options["default_root_dir"]
    deterministic, seed = options["deterministic"], options["seed"]
    use_distributed_sampler = options["use_distributed_sampler"]
    _int(max_steps, "max_steps", minimum=-1, accepted="-1 (no limit) or a positive int")
    if max_steps == 0:
        raise ValueError("max_steps=0 is not valid; expected -1 (no limit) or a positive int.")
    if max_epochs is None:
        max_epochs = DEFAULT_MAX_EPOCHS if max_steps == -1 else -1
    else:
        _int(max_epochs, "max_epochs", minimum=-1, accepted="None, -1 (no limit) or an int >= 0")
    for name in LIMIT_NAMES:
        _limit(options[name], name)
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
    _int(
        options["num_sanity_val_steps"],
        "num_sanity_val_steps",
        minimum=-1,
        accepted="-1 (all batches), 0 (off) or more",
    )
    _int(options["accumulate_grad_batches"], "accumulate_grad_batches", minimum=1, accepted="a positive int")
    if gradient_clip_val is not None:
        if isinstance(gradient_clip_val, bool) or not isinstance(gradient_clip_val, int | float):
            raise TypeError(f"gradient_clip_val={gradient_clip_val!r} is not valid; expected None or a number >= 0.")
        if not (gradient_clip_val >= 0 and math.isfinite(gradient_clip_val)):
            # A NaN bound would turn every gradient into NaN; an infinite one clips nothing.
            raise ValueError(
                f"gradient_clip_val={gradient_clip_val!r} is not valid; expected None or a finite number >= 0."
            )
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
    _int(options["log_every_n_steps"], "log_every_n_steps", minimum=1, accepted="a positive int")
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic={deterministic!r} is not valid; expected True or False.")
    if seed is not None:
        _int(seed, "seed", minimum=0, maximum=MAX_SEED, accepted="None or an int in [0, 2**63 - 1]")
    if not isinstance(use_distributed_sampler, bool):
        raise TypeError(f"use_distributed_sampler={use_distributed_sampler!r} is not valid; expected True or False.")
    if options["nonfinite"] not in get_args(NonFinite):
        raise ValueError(
            f"nonfinite={options['nonfinite']!r} is not valid; expected 'error' (stop at the step), 'skip' (skip "
            "such steps on every rank) or 'ignore' (train on)."
        )
    settings = TrainerSettings(
        **{
            **options,
            "max_epochs": max_epochs,
            "gradient_clip_val": gradient_clip_val,
            "default_root_dir": Path(default_root_dir),
            "max_time": parse_max_time(options["max_time"]),
            "fast_dev_run": _fast_dev_run(options["fast_dev_run"]),
        }
    )
    if settings.fast_dev_run:
        # One epoch of N batches per pass, validated once at its end, with no sanity check (as Lightning does).
        batches = settings.fast_dev_run
        limits: dict[str, Any] = dict.fromkeys(LIMIT_NAMES, batches)
        settings = dataclasses.replace(
            settings,
            **limits,
            max_epochs=1,
            max_steps=-1,
            num_sanity_val_steps=0,
            val_check_interval=1.0,
            check_val_every_n_epoch=1,
        )
    return settings


_TIMEDELTA_KEYS = ("weeks", "days", "hours", "minutes", "seconds", "milliseconds", "microseconds")


def parse_max_time(value: Any) -> timedelta | None:
    """``max_time`` as a positive timedelta: given as one, as a dict of timedelta's keywords (``{"hours": 1}``)
    or as ``"DD:HH:MM:SS"``."""
    accepted = 'None, a datetime.timedelta, a dict like {"hours": 1}, or "DD:HH:MM:SS"'
    if value is None:
        return None
    if isinstance(value, timedelta):
        duration = value
    elif isinstance(value, Mapping):
        unknown = sorted(set(value) - set(_TIMEDELTA_KEYS))
        if unknown:
            raise ValueError(
                f"max_time={value!r} is not valid: unknown keys {unknown}; use {', '.join(_TIMEDELTA_KEYS)}."
            )
        for key, amount in value.items():
            if isinstance(amount, bool) or not isinstance(amount, int | float):
                raise TypeError(f"max_time={value!r} is not valid: {key}={amount!r} is not a number.")
        duration = timedelta(**value)
    elif isinstance(value, str):
        match = re.fullmatch(r"(\d+):(\d{1,2}):(\d{1,2}):(\d{1,2})", value.strip())
        if match is None:
            raise ValueError(f"max_time={value!r} is not valid; a string must be DD:HH:MM:SS, like '00:12:00:00'.")
        days, hours, minutes, seconds = map(int, match.groups())
        duration = timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    else:
        raise TypeError(f"max_time={value!r} ({type(value).__name__}) is not valid; expected {accepted}.")
    if duration <= timedelta(0):
        raise ValueError(f"max_time={value!r} is not valid; it must be a positive duration (got {duration}).")
    return duration


def _fast_dev_run(value: Any) -> int:
    if value is True:
        return 1
    if value is False:
        return 0
    _int(value, "fast_dev_run", minimum=0, accepted="True, False, or a number of batches (int >= 0)")
    return value


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
