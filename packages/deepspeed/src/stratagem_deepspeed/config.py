"""The DeepSpeed config: built from the strategy's options or given by the user, then reconciled
with what the Trainer was asked for (precision, accumulation, clipping, batch size).

Pure Python: nothing here imports deepspeed, so every check runs in the calling process
before any worker starts.
"""

from __future__ import annotations

import copy
import difflib
import math
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from stratagem.config_values import check_config_values, parse_json
from stratagem.printable import shown_repr
from stratagem.strategies import LoopSettings

CONFIG_PATH_VARIABLE = "STRATAGEM_DEEPSPEED_CONFIG_PATH"
"""Environment variable naming a JSON config file, used when the strategy gets no ``config``."""

LIGHTNING_CONFIG_PATH_VARIABLE = "PL_DEEPSPEED_CONFIG_PATH"
"""Lightning's name for the same variable, read as an alias of ``STRATAGEM_DEEPSPEED_CONFIG_PATH``."""

Device = Literal["cpu", "nvme"]
_DEVICES = ("cpu", "nvme")

PRECISION_MODES: dict[str, str] = {
    "32-true": "fp32",
    "bf16-mixed": "bf16",
    "bf16-true": "bf16",
    "16-mixed": "fp16",
    "16-true": "fp16",
}
"""What each Trainer precision means to DeepSpeed, which keeps fp32 master weights in the
optimizer whatever the module's dtype ("-mixed" and "-true" therefore train the same way)."""


@dataclass(frozen=True)
class ZeroOptions:
    """The strategy's own options that shape the default config (ignored when a config is given)."""

    stage: int = 2
    offload_optimizer: bool = False
    offload_parameters: bool = False
    offload_optimizer_device: Device = "cpu"
    offload_params_device: Device = "cpu"
    nvme_path: str = "/local_nvme"
    allgather_bucket_size: int | None = None
    reduce_bucket_size: int | None = None
    contiguous_gradients: bool = True
    overlap_comm: bool = True
    partition_activations: bool = False
    cpu_checkpointing: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stage, bool) or self.stage not in (0, 1, 2, 3):
            raise ValueError(f"DeepSpeedStrategy(stage={self.stage!r}) is not valid; expected 0, 1, 2 or 3.")
        for option in ("offload_optimizer_device", "offload_params_device"):
            value = getattr(self, option)
            if value not in _DEVICES:
                raise ValueError(f"DeepSpeedStrategy({option}={value!r}) is not valid; expected 'cpu' or 'nvme'.")
        if self.offload_optimizer and self.stage == 0:
            raise ValueError(
                "DeepSpeedStrategy(offload_optimizer=True) needs ZeRO stage 1, 2 or 3, but stage=0. Set stage>=1."
            )
        if self.offload_parameters and self.stage != 3:
            raise ValueError(
                f"DeepSpeedStrategy(offload_parameters=True) needs ZeRO stage 3 (only stage 3 shards parameters), "
                f"but stage={self.stage}. Set stage=3, or offload only the optimizer (offload_optimizer=True)."
            )
        for option in ("allgather_bucket_size", "reduce_bucket_size"):
            value = getattr(self, option)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(
                    f"DeepSpeedStrategy({option}={value!r}) is not valid; expected a positive number, or None to "
                    "size it to the model on the CPU (200M elements elsewhere)."
                )

    def to_config(self) -> dict[str, Any]:
        zero: dict[str, Any] = {
            "stage": self.stage,
            "contiguous_gradients": self.contiguous_gradients,
            "overlap_comm": self.overlap_comm,
        }
        # Left out when not given: the strategy sizes them once it knows the device and the model.
        for option in ("allgather_bucket_size", "reduce_bucket_size"):
            value = getattr(self, option)
            if value is not None:
                zero[option] = int(value)
        if self.offload_optimizer:
            zero["offload_optimizer"] = {"device": self.offload_optimizer_device, "nvme_path": self.nvme_path}
        if self.offload_parameters:
            zero["offload_param"] = {"device": self.offload_params_device, "nvme_path": self.nvme_path}
        config: dict[str, Any] = {
            "zero_optimization": zero,
            # Torch optimizers work with every stage; DeepSpeed's own list of tested ones is shorter.
            "zero_allow_untested_optimizer": True,
            # A torch optimizer with offload is slow but correct: the strategy warns instead of refusing.
            "zero_force_ds_cpu_optimizer": False,
        }
        if self.partition_activations or self.cpu_checkpointing:
            config["activation_checkpointing"] = {
                "partition_activations": self.partition_activations,
                "cpu_checkpointing": self.cpu_checkpointing,
            }
        return config


def load_config(config: Mapping[str, Any] | str | os.PathLike[str] | None) -> dict[str, Any] | None:
    """The user's config as a new dict: given directly, read from a JSON file, or named by
    ``STRATAGEM_DEEPSPEED_CONFIG_PATH``; ``None`` when there is none."""
    if config is None:
        return _config_from_environment()
    if isinstance(config, Mapping):
        check_config_values(dict(config), "DeepSpeedStrategy(config=...)")
        return copy.deepcopy(dict(config))
    if isinstance(config, str | os.PathLike):
        return _read_json(Path(config), f"DeepSpeedStrategy(config={str(config)!r})")
    raise TypeError(
        f"DeepSpeedStrategy(config={config!r}) has type {type(config).__name__}; expected a dict or the path of a "
        "JSON file."
    )


def _config_from_environment() -> dict[str, Any] | None:
    paths = {
        variable: os.environ[variable]
        for variable in (CONFIG_PATH_VARIABLE, LIGHTNING_CONFIG_PATH_VARIABLE)
        if os.environ.get(variable)
    }
    if len(set(paths.values())) > 1:
        raise ValueError(
            f"The environment sets both {CONFIG_PATH_VARIABLE}={paths[CONFIG_PATH_VARIABLE]!r} and "
            f"{LIGHTNING_CONFIG_PATH_VARIABLE}={paths[LIGHTNING_CONFIG_PATH_VARIABLE]!r} (Lightning's name for it); "
            "unset one of them."
        )
    for variable, path in paths.items():
        return _read_json(Path(path), f"The environment variable {variable}={path!r}")
    return None


def _read_json(path: Path, origin: str) -> dict[str, Any]:
    if not path.is_file():
        raise ValueError(f"{origin} names no file; expected the path of a DeepSpeed JSON config.")
    loaded = parse_json(path.read_text(), origin)
    if not isinstance(loaded, dict):
        raise ValueError(f"{origin}: the file holds a {type(loaded).__name__}; expected a JSON object.")
    return loaded


def check_top_level_keys(config: Mapping[str, Any], known: Collection[str], tolerated: Collection[str] = ()) -> None:
    """Refuse top-level keys of ``config`` that are neither ``known`` (the keys DeepSpeed reads: listed and
    suggested) nor ``tolerated`` (key names DeepSpeed defines, some of them nested, accepted without being listed).

    DeepSpeed looks up the keys it knows and ignores the rest, so a misspelt section would silently not apply.
    """
    unknown = sorted(set(config) - set(known) - set(tolerated))
    if not unknown:
        return
    described = []
    every_key_has_a_match = True
    for key in unknown:
        close = difflib.get_close_matches(str(key), sorted(known), n=3, cutoff=0.75)
        every_key_has_a_match = every_key_has_a_match and bool(close)
        described.append(f"{key!r} (did you mean {' or '.join(map(repr, close))}?)" if close else repr(key))
    listing = "" if every_key_has_a_match else f" The keys DeepSpeed reads: {', '.join(sorted(known))}."
    raise ValueError(
        f"The DeepSpeed config has top-level key(s) DeepSpeed does not read, which it would ignore without a word: "
        f"{', '.join(described)}.{listing}"
    )


def zero_stage(config: Mapping[str, Any]) -> int:
    """The ZeRO stage a config asks for (0 when it has no ``zero_optimization``)."""
    return int(config.get("zero_optimization", {}).get("stage", 0))


def offload_devices(config: Mapping[str, Any]) -> dict[str, str]:
    """``{"optimizer": device, "param": device}`` for the offloads a config enables."""
    zero = config.get("zero_optimization", {})
    found = {}
    for what, key in (("optimizer", "offload_optimizer"), ("param", "offload_param")):
        device = (zero.get(key) or {}).get("device", "none")
        if device in _DEVICES:
            found[what] = device
    return found


def precision_mode(precision_name: str) -> str:
    """``"fp32"``, ``"bf16"`` or ``"fp16"`` for a Trainer precision, or ``ValueError`` saying which work."""
    try:
        return PRECISION_MODES[precision_name]
    except KeyError:
        raise ValueError(
            f"precision={precision_name!r} is not supported by DeepSpeed strategies; use one of "
            f"{', '.join(repr(name) for name in PRECISION_MODES)}."
        ) from None


def reconcile(
    config: dict[str, Any],
    *,
    user_given: bool,
    precision_name: str,
    device_type: str,
    loop_settings: LoopSettings | None,
    micro_batch_size: int | None,
    world_size: int,
) -> dict[str, Any]:
    """Fill what the Trainer decides into ``config`` (a copy is returned); a contradiction is a
    ``ValueError`` naming both values.

    ``loop_settings`` is ``None`` until the Trainer has said how it loops; the config's own
    accumulation and clipping stand until then. ``user_given`` only changes the wording of
    errors: the user wrote those values.
    """
    config = copy.deepcopy(config)
    source = "the DeepSpeed config" if user_given else "DeepSpeedStrategy's options"
    _reconcile_precision(config, source, precision_name, device_type)
    if loop_settings is None:
        accumulate = int(config.get("gradient_accumulation_steps") or 1)
        config["gradient_accumulation_steps"] = accumulate
    else:
        accumulate = loop_settings.accumulate_grad_batches
        _reconcile_accumulation(config, source, accumulate)
        _reconcile_clipping(config, source, loop_settings.gradient_clip_val, loop_settings.gradient_clip_algorithm)
    _reconcile_batch_size(config, source, micro_batch_size, accumulate, world_size)
    _refuse_cpu_checkpointing(config, source, device_type)
    return config


def _enabled(config: Mapping[str, Any], section: str) -> bool:
    value = config.get(section)
    return isinstance(value, Mapping) and bool(value.get("enabled", False))


def _reconcile_precision(config: dict[str, Any], source: str, precision_name: str, device_type: str) -> None:
    mode = precision_mode(precision_name)
    for section in ("fp16", "bf16"):
        if _enabled(config, section) and section != mode:
            wanted = "'16-mixed'" if section == "fp16" else "'bf16-mixed'"
            raise ValueError(
                f"{source} enables {section} ({section!r}: {{'enabled': true}}) but the Trainer's precision is "
                f"{precision_name!r}. Make them agree: pass precision={wanted} to the Trainer, or remove "
                f"the {section!r} section from the config."
            )
    if mode == "fp16" and device_type == "cpu":
        raise ValueError(
            f"precision={precision_name!r} (DeepSpeed fp16) does not work on accelerator='cpu': DeepSpeed's CPU "
            "accelerator refuses fp16 ('Type fp16 is not supported on your device'). Use precision='bf16-mixed' or "
            "'32-true'."
        )
    if mode in ("fp16", "bf16"):
        section = config.setdefault(mode, {})
        section["enabled"] = True


def _reconcile_accumulation(config: dict[str, Any], source: str, accumulate_grad_batches: int) -> None:
    given = config.get("gradient_accumulation_steps")
    if given is not None and given != "auto" and int(given) != accumulate_grad_batches:
        raise ValueError(
            f"{source} sets gradient_accumulation_steps={given}, but the Trainer's accumulate_grad_batches="
            f"{accumulate_grad_batches}. The Trainer counts batches per optimizer step, so they must agree: pass "
            f"accumulate_grad_batches={given} to the Trainer, or remove gradient_accumulation_steps from the config."
        )
    config["gradient_accumulation_steps"] = accumulate_grad_batches


def _reconcile_clipping(
    config: dict[str, Any], source: str, gradient_clip_val: float | None, gradient_clip_algorithm: str
) -> None:
    if gradient_clip_val is not None and gradient_clip_algorithm != "norm":
        raise ValueError(
            f"gradient_clip_algorithm={gradient_clip_algorithm!r} is not supported by DeepSpeed, whose engine clips "
            "by global norm only. Use gradient_clip_algorithm='norm'."
        )
    given = _clipping(config.get("gradient_clipping"), source)
    if gradient_clip_val is None:
        # The Trainer asked for nothing: the config's clipping (if any) stands.
        config["gradient_clipping"] = given or 0.0
        return
    if given is not None and given != float(gradient_clip_val):
        raise ValueError(
            f"{source} sets gradient_clipping={given}, but the Trainer's gradient_clip_val={gradient_clip_val}. "
            "Give the value in one place: remove gradient_clipping from the config, or gradient_clip_val from "
            "the Trainer."
        )
    config["gradient_clipping"] = float(gradient_clip_val)


def _clipping(given: Any, source: str) -> float | None:
    """The config's ``gradient_clipping`` as a norm, ``None`` for none; DeepSpeed clips only above 0, so a NaN or
    negative value would silently never clip."""
    if given is None or given == "auto":
        return None
    try:
        value = math.nan if isinstance(given, bool) else float(given)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(
            f"{source} sets gradient_clipping={shown_repr(given, 60)}; expected a finite number of at least 0 (0, "
            "'auto' or no entry: no clipping). DeepSpeed would never clip with it."
        )
    return value or None


def _reconcile_batch_size(
    config: dict[str, Any], source: str, micro_batch_size: int | None, accumulate: int, world_size: int
) -> None:
    micro = config.get("train_micro_batch_size_per_gpu")
    micro = None if micro == "auto" else micro
    total = config.get("train_batch_size")
    total = None if total == "auto" else total
    if micro is not None and micro_batch_size is not None and int(micro) != micro_batch_size:
        raise ValueError(
            f"{source} sets train_micro_batch_size_per_gpu={micro}, but the training dataloader yields batches of "
            f"{micro_batch_size}. Make them agree, or remove train_micro_batch_size_per_gpu from the config."
        )
    micro = int(micro) if micro is not None else micro_batch_size
    if micro is None:
        # The strategy drives every step itself, so DeepSpeed uses the batch size only for its logs.
        micro = int(total) // (accumulate * world_size) if total is not None else 1
    expected_total = micro * accumulate * world_size
    if total is not None and int(total) != expected_total:
        raise ValueError(
            f"{source} sets train_batch_size={total}, but micro batch {micro} x accumulate_grad_batches {accumulate} "
            f"x {world_size} process(es) = {expected_total}. Set train_batch_size={expected_total}, or remove it and "
            "let it be computed."
        )
    config["train_micro_batch_size_per_gpu"] = micro
    config["train_batch_size"] = expected_total


def _refuse_cpu_checkpointing(config: Mapping[str, Any], source: str, device_type: str) -> None:
    checkpointing = config.get("activation_checkpointing") or {}
    if device_type == "cpu" and checkpointing.get("cpu_checkpointing"):
        raise ValueError(
            f"{source} enables activation_checkpointing.cpu_checkpointing (cpu_checkpointing=True), which fails on "
            "accelerator='cpu' (DeepSpeed's backward breaks with 'both arguments to linear need to be at least 1D'); "
            "activations already live in CPU memory there. Set cpu_checkpointing=False."
        )
