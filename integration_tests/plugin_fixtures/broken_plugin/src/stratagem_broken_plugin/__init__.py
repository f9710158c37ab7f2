"""A plugin that fails while registering, after registering one name (which must be rolled back)."""

from __future__ import annotations

from typing import Any

MESSAGE = "stratagem-broken-plugin fails on purpose while registering"


def register(registry: Any) -> None:
    registry.register("broken_half_registered", "collections:OrderedDict", description="Never visible.")
    raise RuntimeError(MESSAGE)
