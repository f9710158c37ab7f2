"""What every XLA strategy does with the options they share: XLA's accelerator and checkpoint IO unless given
others, and ``debug``."""

from __future__ import annotations

from stratagem.strategies import StrategyOptions
from stratagem_xla.accelerator import XLAAccelerator
from stratagem_xla.checkpoint_io import XLACheckpointIO


def with_xla_defaults(options: StrategyOptions) -> StrategyOptions:
    """``options`` with XLA's accelerator, and the checkpoint IO that moves every tensor to the CPU before it
    writes, where they give none."""
    return {
        **options,
        "accelerator": options.get("accelerator") or XLAAccelerator(),
        "checkpoint_io": options.get("checkpoint_io") or XLACheckpointIO(),
    }


def check_debug(debug: object, strategy: str) -> bool:
    """``debug`` (print XLA's metrics report when the run ends), refused unless it is True or False."""
    if not isinstance(debug, bool):
        raise TypeError(f"{strategy}(debug={debug!r}) is not valid; expected True or False.")
    return debug
