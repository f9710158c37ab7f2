"""Module-creation contexts shared by strategies."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode


class skip_parameter_init(TorchFunctionMode):
    """Make ``torch.nn.init`` functions return their tensor untouched.

    For modules whose weights will be loaded right after creation: random initialisation of
    a large model costs seconds and is thrown away.
    """

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            tensor = kwargs.get("tensor", args[0] if args else None)
            if isinstance(tensor, torch.Tensor):
                return tensor
        return func(*args, **kwargs)
