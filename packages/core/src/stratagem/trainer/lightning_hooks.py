"""Hooks Lightning modules define that stratagem does not call: said once, before any process starts."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stratagem.module import Module

NOT_CALLED: dict[str, str] = {
    "training_step_end": "do that work at the end of training_step (its return value is the loss)",
    "validation_step_end": "do that work at the end of validation_step, or aggregate in on_validation_epoch_end",
    "test_step_end": "do that work at the end of test_step, or aggregate in on_test_epoch_end",
    "training_epoch_end": "use on_train_epoch_end (keep the step outputs you need on self)",
    "validation_epoch_end": "use on_validation_epoch_end (keep the step outputs you need on self)",
    "test_epoch_end": "use on_test_epoch_end (keep the step outputs you need on self)",
}
"""Lightning 1.x hooks removed in Lightning 2.0 -> what to do instead."""

RENAMED: dict[str, str] = {"configure_sharded_model": "configure_model"}
"""Lightning's older hook names -> stratagem's."""

_warned: set[tuple[type, str]] = set()


def check_lightning_hooks(module: Module) -> None:
    """Warn once per class about hooks that are never called; refuse renamed ones naming the new name."""
    module_class = type(module)
    for hook, instead in NOT_CALLED.items():
        if callable(getattr(module_class, hook, None)) and (module_class, hook) not in _warned:
            _warned.add((module_class, hook))
            warnings.warn(
                f"{module_class.__name__} defines {hook}(), which stratagem never calls (Lightning 2.0 removed it "
                f"too): {instead}.",
                UserWarning,
                stacklevel=4,
            )
    for old, new in RENAMED.items():
        if callable(getattr(module_class, old, None)):
            raise TypeError(
                f"{module_class.__name__} defines {old}(), Lightning's older name for {new}(), which stratagem calls "
                f"instead (in every process, inside the strategy's sharding context). Rename it to {new}."
            )
