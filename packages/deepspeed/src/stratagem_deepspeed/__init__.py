"""stratagem-deepspeed: DeepSpeed ZeRO strategies for stratagem.

Importing this package is cheap and never imports deepspeed: the names below load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stratagem_deepspeed.checkpoint_io import DeepSpeedCheckpointIO
    from stratagem_deepspeed.consolidate import convert_zero_checkpoint_to_fp32_state_dict
    from stratagem_deepspeed.strategy import DeepSpeedStrategy

__all__ = ["DeepSpeedCheckpointIO", "DeepSpeedStrategy", "__version__", "convert_zero_checkpoint_to_fp32_state_dict"]

_LAZY = {
    "DeepSpeedStrategy": ("stratagem_deepspeed.strategy", "DeepSpeedStrategy"),
    "DeepSpeedCheckpointIO": ("stratagem_deepspeed.checkpoint_io", "DeepSpeedCheckpointIO"),
    "convert_zero_checkpoint_to_fp32_state_dict": (
        "stratagem_deepspeed.consolidate",
        "convert_zero_checkpoint_to_fp32_state_dict",
    ),
}


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import version

        return version("stratagem-deepspeed")
    if name in _LAZY:
        module_name, attribute = _LAZY[name]
        value = getattr(importlib.import_module(module_name), attribute)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'stratagem_deepspeed' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
