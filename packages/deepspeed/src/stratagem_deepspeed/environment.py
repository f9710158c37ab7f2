"""Importing DeepSpeed for the right device; checking a config and the optional ops with DeepSpeed itself."""

from __future__ import annotations

import copy
import os
import re
from collections.abc import KeysView
from types import ModuleType
from typing import Any

from stratagem_deepspeed.config import check_top_level_keys
from stratagem_deepspeed.quiet_warnings import ignore_uninformative_warnings

ACCELERATOR_VARIABLE = "DS_ACCELERATOR"

_DEEPSPEED_ACCELERATORS = {"cpu": "cpu", "cuda": "cuda", "mps": "mps", "hpu": "hpu"}
"""stratagem device type -> DeepSpeed accelerator name."""


def import_deepspeed() -> ModuleType:
    """``deepspeed``, imported on first use (it takes seconds) with a clear error when missing, and the warnings
    its use raises from torch that tell the user nothing ignored (see ``quiet_warnings``)."""
    ignore_uninformative_warnings()
    try:
        import deepspeed
    except ImportError as error:
        raise ImportError(
            f"The DeepSpeed strategies need deepspeed, which failed to import ({error}): "
            'pip install "stratagem[deepspeed]" (or pip install "deepspeed>=0.19.8").'
        ) from error
    return deepspeed


def select_deepspeed_accelerator(device_type: str) -> None:
    """Make DeepSpeed use the accelerator the run was resolved for, in this process and the ones it starts.

    DeepSpeed picks its accelerator once, at import, by probing the hardware; a run asked for
    ``accelerator="cpu"`` on a GPU machine must not end up on the GPU.
    """
    wanted = _DEEPSPEED_ACCELERATORS.get(device_type)
    if wanted is None:
        raise ValueError(
            f"The DeepSpeed strategies do not support accelerator={device_type!r}; use one of "
            f"{', '.join(map(repr, _DEEPSPEED_ACCELERATORS))}."
        )
    current = os.environ.get(ACCELERATOR_VARIABLE)
    if current is not None and current != wanted:
        raise ValueError(
            f"The environment sets {ACCELERATOR_VARIABLE}={current!r}, but the run uses accelerator={device_type!r}. "
            f"Unset {ACCELERATOR_VARIABLE}, or set it to {wanted!r}."
        )
    os.environ[ACCELERATOR_VARIABLE] = wanted


def async_io_problem() -> str | None:
    """Why DeepSpeed's async_io op (NVMe offload) cannot be built here, or ``None`` when it can."""
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("AsyncIOBuilder")
    if builder is None:
        return (
            f"NVMe offload needs DeepSpeed's async_io op, which DeepSpeed does not provide for its "
            f"{get_accelerator().device_name()!r} accelerator. Offload to 'cpu' instead."
        )
    if builder.is_compatible(verbose=False):
        return None
    return (
        "NVMe offload (offload to 'nvme', or remote_device='nvme') needs DeepSpeed's async_io op, which needs the "
        "libaio library and headers, and they were not found (DeepSpeed's compile-and-link test of io_submit "
        "failed). Install them: apt-get install libaio-dev (Debian/Ubuntu) or yum install libaio-devel "
        "(RHEL/Fedora); if libaio is installed elsewhere, point CFLAGS and LDFLAGS at it. Or offload to 'cpu'."
    )


def check_config_with_deepspeed(config: dict[str, Any]) -> None:
    """Parse ``config`` with DeepSpeed's own config class, so that its error (naming the bad key)
    reaches the user before any process starts, as a ``ValueError``; then refuse top-level keys
    DeepSpeed does not read, which it would ignore without a word."""
    from deepspeed.runtime.config import DeepSpeedConfig

    # Outside the workers DeepSpeed sees a world of one; the batch-size product was checked already.
    parsed = copy.deepcopy(config)
    parsed.pop("train_batch_size", None)
    read: set[str] = set()
    try:
        DeepSpeedConfig(_recording_reads(parsed, read))
    except Exception as error:
        raise ValueError(f"DeepSpeed rejects the config: {type(error).__name__}: {error}") from error
    check_top_level_keys(config, known=read | set(_KEYS_READ_BY_INITIALIZE), tolerated=_deepspeed_key_constants())


_KEYS_READ_BY_INITIALIZE = ("data_parallel_size", "sequence_parallel_size")
"""Top-level keys ``deepspeed.initialize`` reads itself (to build a device mesh), outside its config class."""


def _recording_reads(config: dict[str, Any], read: set[str]) -> dict[str, Any]:
    """``config`` as a dict that adds every key looked up in it to ``read`` (also in the copies DeepSpeed makes)."""

    class _ReadKeys(KeysView[str]):
        def __contains__(self, key: object) -> bool:
            read.add(str(key))
            return super().__contains__(key)

    class _Recording(dict[str, Any]):
        def get(self, key: str, default: Any = None) -> Any:
            read.add(key)
            return super().get(key, default)

        def __getitem__(self, key: str) -> Any:
            read.add(key)
            return super().__getitem__(key)

        def __contains__(self, key: object) -> bool:
            read.add(str(key))
            return super().__contains__(key)

        def keys(self) -> _ReadKeys:  # type: ignore[override]
            return _ReadKeys(self)

    return _Recording(config)


def _deepspeed_key_constants() -> set[str]:
    """The config keys DeepSpeed names in ``deepspeed.runtime.constants`` (its top-level keys, and some nested ones)."""
    from deepspeed.runtime import constants

    return {
        value
        for name, value in vars(constants).items()
        if name.isupper() and isinstance(value, str) and re.fullmatch(r"[a-z][a-z0-9_]*", value)
    }
