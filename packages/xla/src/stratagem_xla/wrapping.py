"""Options shared by the XLA FSDP strategies: which module classes are wrapped, which are checkpointed."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from torch import nn


def module_classes(value: Any, option: str, strategy: str) -> frozenset[type[nn.Module]]:
    """``value`` (one ``nn.Module`` subclass, several, or ``None``) as a set; ``TypeError`` naming ``option``."""
    if value is None:
        return frozenset()
    items = [value] if isinstance(value, type) else value
    if not isinstance(items, Iterable) or not all(
        isinstance(item, type) and issubclass(item, nn.Module) for item in items
    ):
        raise TypeError(
            f"{strategy}({option}={value!r}) is not valid; expected an nn.Module subclass or a set of them, such as "
            "{TransformerBlock}."
        )
    return frozenset(items)


def auto_wrap_policy(classes: frozenset[type[nn.Module]]) -> Callable[..., bool] | None:
    """torch_xla's policy wrapping every submodule of one of ``classes`` in its own FSDP unit."""
    if not classes:
        return None
    from torch_xla.distributed.fsdp.wrap import transformer_auto_wrap_policy

    return functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=set(classes))


def checkpointing_wrapper(
    wrapper: type[nn.Module], classes: frozenset[type[nn.Module]]
) -> Callable[..., nn.Module] | None:
    """An ``auto_wrapper_callable`` wrapping modules of ``classes`` in activation checkpointing, then in ``wrapper``
    (``None`` when there are no classes: plain wrapping)."""
    if not classes:
        return None
    from torch_xla.distributed.fsdp import checkpoint_module

    def wrap(module: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
        if isinstance(module, tuple(classes)):
            module = checkpoint_module(module)
        return wrapper(module, *args, **kwargs)

    return wrap
