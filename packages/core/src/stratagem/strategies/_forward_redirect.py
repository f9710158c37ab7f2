"""Calling a module's step method through its wrapper's forward.

Wrappers such as DistributedDataParallel and FSDP do their work (gradient-sync preparation,
parameter gathering) in hooks around ``forward``. A step method called directly would skip
them, so the step is routed through ``wrapper(*args)`` with ``forward`` temporarily pointing
at the step. Inside, ``forward`` is restored first, so ``self(x)`` in the step still works.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from torch import nn


def call_through_forward(wrapper: nn.Module, module: nn.Module, step_name: str, *args: Any) -> Any:
    step = getattr(module, step_name)
    if wrapper is module and not _has_forward_hooks(module):
        return step(*args)
    original_forward = module.forward
    # A forward set on the instance (a compiled one) is put back; a class's forward is left to the class.
    own_forward = "forward" in module.__dict__

    def redirected(*inner_args: Any, **inner_kwargs: Any) -> Any:
        module.forward = original_forward  # type: ignore[method-assign]
        return step(*inner_args, **inner_kwargs)

    module.forward = redirected  # type: ignore[method-assign]
    try:
        return wrapper(*args)
    finally:
        if own_forward:
            module.forward = original_forward  # type: ignore[method-assign]
        else:
            module.__dict__.pop("forward", None)


def step_caller(wrapper: nn.Module, module: nn.Module, step_name: str) -> Callable[..., Any]:
    """``call_through_forward(wrapper, module, step_name, *args)`` as one callable taking ``*args``, for a loop
    that calls the same step on every batch: the step is looked up once, forward hooks still on every call."""
    if wrapper is not module:
        return functools.partial(call_through_forward, wrapper, module, step_name)
    step = getattr(module, step_name)

    def call(*args: Any) -> Any:
        if module._forward_pre_hooks or module._forward_hooks:
            return call_through_forward(module, module, step_name, *args)
        return step(*args)

    return call


def _has_forward_hooks(module: nn.Module) -> bool:
    return bool(module._forward_pre_hooks or module._forward_hooks)
