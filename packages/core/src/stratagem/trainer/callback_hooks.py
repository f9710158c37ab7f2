"""Calling callback hooks: only the callbacks that override a hook are called for it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from stratagem.callbacks.callback import Callback


class CallbackHooks:
    """Dispatches hooks to callbacks. Looking up who overrides a hook happens once per hook
    name, so a per-batch hook nobody uses costs nothing."""

    def __init__(self, callbacks: Sequence[Callback]) -> None:
        self.callbacks = list(callbacks)
        self._cache: dict[str, list[Callable[..., Any]]] = {}

    def overriding(self, name: str) -> list[Callable[..., Any]]:
        """The bound hook ``name`` of every callback whose class overrides it, in callback order."""
        found = self._cache.get(name)
        if found is None:
            default = getattr(Callback, name)
            found = [
                getattr(callback, name) for callback in self.callbacks if getattr(type(callback), name) is not default
            ]
            self._cache[name] = found
        return found

    def call(self, name: str, *args: Any) -> None:
        for hook in self.overriding(name):
            hook(*args)
