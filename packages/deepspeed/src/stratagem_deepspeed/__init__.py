"""stratagem-deepspeed: DeepSpeed ZeRO strategies for stratagem.

Importing this package is cheap and never imports deepspeed: the names below load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stratagem.exports import lazy_exports

if TYPE_CHECKING:
    from stratagem_deepspeed.checkpoint_io import DeepSpeedCheckpointIO
    from stratagem_deepspeed.consolidate import convert_zero_checkpoint_to_fp32_state_dict
    from stratagem_deepspeed.strategy import DeepSpeedStrategy

__all__ = ["DeepSpeedCheckpointIO", "DeepSpeedStrategy", "__version__", "convert_zero_checkpoint_to_fp32_state_dict"]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "DeepSpeedStrategy": "stratagem_deepspeed.strategy",
        "DeepSpeedCheckpointIO": "stratagem_deepspeed.checkpoint_io",
        "convert_zero_checkpoint_to_fp32_state_dict": "stratagem_deepspeed.consolidate",
    },
    "stratagem-deepspeed",
)
