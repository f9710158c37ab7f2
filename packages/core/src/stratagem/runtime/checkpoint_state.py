"""Between a user's checkpoint state and the strategy's: modules and optimizers stay live (the strategy saves
them whole or sharded), other stateful objects become their ``state_dict``, plain values stay as they are."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stratagem.runtime.wrappers import unwrapped
from stratagem.strategies.live_state import is_live_state

if TYPE_CHECKING:
    from stratagem.checkpoint_io import PathLike
    from stratagem.strategies import Strategy


def saved_state(state: dict[str, Any]) -> dict[str, Any]:
    """What to hand to ``Strategy.save_checkpoint`` for the user's ``state``."""
    checkpoint: dict[str, Any] = {}
    for key, value in state.items():
        value = unwrapped(value)
        if is_live_state(value):
            checkpoint[key] = value
        elif _is_stateful(value):
            checkpoint[key] = value.state_dict()
        elif isinstance(value, list | tuple) and value and all(_is_stateful(item) for item in value):
            checkpoint[key] = [item.state_dict() for item in value]
        else:
            checkpoint[key] = value
    return checkpoint


def load_state(
    strategy: Strategy, path: PathLike, state: dict[str, Any], *, strict: bool, weights_only: bool
) -> dict[str, Any]:
    """Load ``path`` into ``state`` in place (see ``Runtime.load``); return the checkpoint's other entries."""
    live = {key: unwrapped(value) for key, value in state.items() if is_live_state(unwrapped(value))}
    remaining = strategy.load_checkpoint(path, live, strict=strict, weights_only=weights_only)
    for key, value in state.items():
        if key in live:
            continue
        if key not in remaining:
            raise KeyError(f"The checkpoint {str(path)!r} has no entry {key!r}; it has {sorted(remaining)}.")
        saved = remaining.pop(key)
        if _is_stateful(value):
            value.load_state_dict(saved)
        elif isinstance(value, list | tuple) and value and all(_is_stateful(item) for item in value):
            if not isinstance(saved, list | tuple) or len(saved) != len(value):
                count = len(saved) if isinstance(saved, list | tuple) else "not a list of"
                raise ValueError(
                    f"The checkpoint {str(path)!r} holds {count} state(s) under {key!r}; got {len(value)} to load."
                )
            for item, item_state in zip(value, saved):
                item.load_state_dict(item_state)
        else:
            state[key] = saved
    return remaining


def _is_stateful(value: Any) -> bool:
    return callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None))
