"""Lightning's ``DeepSpeedStrategy`` keyword arguments, mapped onto the DeepSpeed config they stand for.

Lightning's constructor takes about forty options; stratagem's names the common ones and accepts
the rest under Lightning's names, written to the same config keys Lightning writes them to.
Pure Python: nothing here imports deepspeed.
"""

from __future__ import annotations

import copy
import difflib
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

_ZERO = ("zero_optimization",)
_OFFLOAD_OPTIMIZER = ("zero_optimization", "offload_optimizer")
_OFFLOAD_PARAM = ("zero_optimization", "offload_param")
_AIO = ("aio",)
_CHECKPOINTING = ("activation_checkpointing",)

CONFIG_PATHS: dict[str, tuple[tuple[tuple[str, ...], str], ...]] = {
    "sub_group_size": ((_ZERO, "sub_group_size"),),
    "allgather_partitions": ((_ZERO, "allgather_partitions"),),
    "reduce_scatter": ((_ZERO, "reduce_scatter"),),
    "pin_memory": ((_OFFLOAD_OPTIMIZER, "pin_memory"), (_OFFLOAD_PARAM, "pin_memory")),
    "optimizer_buffer_count": ((_OFFLOAD_OPTIMIZER, "buffer_count"),),
    "params_buffer_count": ((_OFFLOAD_PARAM, "buffer_count"),),
    "params_buffer_size": ((_OFFLOAD_PARAM, "buffer_size"),),
    "max_in_cpu": ((_OFFLOAD_PARAM, "max_in_cpu"),),
    "block_size": ((_AIO, "block_size"),),
    "queue_depth": ((_AIO, "queue_depth"),),
    "single_submit": ((_AIO, "single_submit"),),
    "overlap_events": ((_AIO, "overlap_events"),),
    "thread_count": ((_AIO, "thread_count"),),
    "contiguous_memory_optimization": ((_CHECKPOINTING, "contiguous_memory_optimization"),),
    "synchronize_checkpoint_boundary": ((_CHECKPOINTING, "synchronize_checkpoint_boundary"),),
    "zero_allow_untested_optimizer": (((), "zero_allow_untested_optimizer"),),
}
"""Lightning option -> the config sections and keys Lightning writes it to. An offload section is
written only when that offload is on, as Lightning does."""

FP16_OPTIONS = ("loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis", "min_loss_scale")
"""Lightning's loss-scaling options: keys of the config's ``fp16`` section, used only with fp16."""

OTHER_OPTIONS = ("zero_optimization", "logging_batch_size_per_gpu", "load_full_weights")

RENAMED = {"precision_plugin": "precision"}
"""Lightning's spelling -> stratagem's, for options both have under different names."""


@dataclass
class LightningOptions:
    """The Lightning options a ``DeepSpeedStrategy`` was given, sorted by where they go."""

    config_values: dict[str, Any] = field(default_factory=dict)
    fp16: dict[str, Any] = field(default_factory=dict)
    zero_optimization: bool = True
    logging_batch_size_per_gpu: int | None = None
    warned_about_loss_scaling: bool = False

    def apply(self, config: dict[str, Any]) -> dict[str, Any]:
        """``config`` (built from the strategy's own options) with these options written in; a copy."""
        config = copy.deepcopy(config)
        for option, value in self.config_values.items():
            for section_path, key in CONFIG_PATHS[option]:
                section = _section(config, section_path)
                if section is not None:
                    section[key] = value
        return config

    def apply_loss_scaling(self, config: dict[str, Any], precision_name: str) -> dict[str, Any]:
        """``config`` with the loss-scaling options in its ``fp16`` section; a warning when the run is
        not in fp16, where DeepSpeed scales no loss and they would do nothing."""
        if not self.fp16:
            return config
        section = config.get("fp16")
        if isinstance(section, dict) and section.get("enabled"):
            section.update(self.fp16)
            return config
        if self.warned_about_loss_scaling:
            return config
        # The config is reconciled again whenever the Trainer's settings change: one warning is enough.
        self.warned_about_loss_scaling = True
        warnings.warn(
            f"DeepSpeedStrategy({', '.join(f'{key}={value!r}' for key, value in self.fp16.items())}) set fp16 loss "
            f"scaling, which precision={precision_name!r} does not use (only '16-mixed' scales the loss); they have "
            "no effect in this run.",
            UserWarning,
            stacklevel=2,
        )
        return config


def parse_lightning_options(
    options: Mapping[str, Any], config_given: bool, own_options: Iterable[str] = ()
) -> LightningOptions:
    """Sort Lightning's keyword arguments; an unknown name is a ``TypeError`` naming the close ones among these and
    ``own_options`` (the strategy's named ones)."""
    known = (*CONFIG_PATHS, *FP16_OPTIONS, *OTHER_OPTIONS)
    parsed = LightningOptions()
    for option, value in options.items():
        if option in RENAMED:
            raise TypeError(
                f"DeepSpeedStrategy({option}=...) is Lightning's name; stratagem's is {RENAMED[option]}= "
                f"(DeepSpeedStrategy({RENAMED[option]}=...), or precision= on the Trainer)."
            )
        if option not in known:
            close = difflib.get_close_matches(option, [*known, *own_options], n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise TypeError(f"DeepSpeedStrategy() got an unexpected keyword argument {option!r}.{hint}")
        if config_given and option != "load_full_weights":
            raise ValueError(
                f"DeepSpeedStrategy({option}={value!r}) was given together with config=, which replaces the "
                f"strategy's options; write it into the config instead ({_where(option)})."
            )
        if option in CONFIG_PATHS:
            parsed.config_values[option] = value
        elif option in FP16_OPTIONS:
            parsed.fp16[option] = value
        elif option == "zero_optimization":
            parsed.zero_optimization = _boolean(option, value)
        elif option == "logging_batch_size_per_gpu":
            parsed.logging_batch_size_per_gpu = _logging_batch_size(value)
        else:
            # stratagem always loads a single full-weights file into stage 3 (it recognises one by its layout).
            _boolean(option, value)
    return parsed


def _where(option: str) -> str:
    if option in FP16_OPTIONS:
        return f"'fp16': {{{option!r}: ...}}"
    if option == "zero_optimization":
        return "'zero_optimization': {'stage': 0} to turn ZeRO off"
    if option == "logging_batch_size_per_gpu":
        return "'train_micro_batch_size_per_gpu'"
    section_path, key = CONFIG_PATHS[option][0]
    return " -> ".join(repr(part) for part in (*section_path, key))


def _section(config: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any] | None:
    section = config
    for part in path:
        child = section.get(part)
        if child is None and part in _CHECKPOINTING + _AIO:
            child = section[part] = {}
        if not isinstance(child, dict):
            return None
        section = child
    return section


def _boolean(option: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"DeepSpeedStrategy({option}={value!r}) is not valid; expected True or False.")
    return value


def _logging_batch_size(value: Any) -> int | None:
    if value == "auto":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"DeepSpeedStrategy(logging_batch_size_per_gpu={value!r}) is not valid; expected 'auto' or a positive int."
        )
    return value


def upgrade_boolean_offload(config: dict[str, Any]) -> dict[str, Any]:
    """Older DeepSpeed configs (and Lightning's docs) write ``"offload_optimizer": true``; DeepSpeed now
    wants a section. ``true`` means offload to CPU memory, ``false`` none. Returns a copy."""
    zero = config.get("zero_optimization")
    if not isinstance(zero, dict):
        return config
    config = copy.deepcopy(config)
    zero = config["zero_optimization"]
    for key in ("offload_optimizer", "offload_param"):
        if zero.get(key) is True:
            zero[key] = {"device": "cpu"}
        elif zero.get(key) is False:
            del zero[key]
    return config
