"""``strategy="auto"``: plan from the module at the start of ``fit`` and carry the choice to every worker."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

from stratagem.planning import planner
from stratagem.planning.planner import plan, strategies_to_plan

if TYPE_CHECKING:
    from stratagem.connector import WiringOptions

CHOICE_VARIABLE = "STRATAGEM_AUTO_STRATEGY"
"""Set by the calling process while it starts workers, so that a re-executed script takes the caller's choice
instead of planning again from memory that the other ranks are already using."""

TRIVIAL_MEMORY_SHARE = 1e-4
"""A module built in ``__init__`` whose tensors take less than this share of the memory here is not planned: even
with gradients, any optimizer's states and a rank per device it uses a few percent at most."""


def choose_strategy(
    module: nn.Module, request: WiringOptions, default: str, device: torch.device | None = None
) -> tuple[str, str | None]:
    """The registered name to train ``module`` with, and the one-line reason (``None`` in a worker that took
    the calling process's choice). ``request`` is what the user gave the Trainer besides ``strategy="auto"``,
    which the planned strategy is resolved with. ``default`` is what ``auto`` means without a model (``ddp``,
    ``single_device``, or the strategy that takes the layout given): it is kept whenever it fits. ``device``, the
    default's root device, lets a trivially small module keep the default without being planned."""
    from stratagem import registry

    inherited = os.environ.get(CHOICE_VARIABLE)
    if inherited:
        return inherited, None
    if device is not None:
        tensor_bytes = _trivially_small_bytes(module, device)
        if tensor_bytes is not None:
            return default, f"auto → {default}: the model's {tensor_bytes:,} bytes of tensors fit any strategy"
    try:
        first = plan(module, [default], first_fit=True, **request)
    except Exception as error:  # copying or building the user's module on meta failed: plan nothing, change nothing
        return default, f"auto → {default}: the model could not be measured ({type(error).__name__}: {error})"
    if first.chosen is not None:
        return default, first.reason()
    planned = plan(module, strategies_to_plan(default, registry.strategies.names()), **request)
    chosen = planned.chosen
    if chosen is None:
        raise ValueError(
            f"strategy='auto' found no strategy to train {type(module).__name__}: {planned.reason()}. "
            "Run `stratagem plan` for every strategy's estimate, or pass strategy= to choose one yourself."
        )
    return chosen.name, planned.reason()


def _trivially_small_bytes(module: nn.Module, device: torch.device) -> int | None:
    """The bytes of ``module``'s tensors when they are all there already and too few to plan for, else ``None``.

    Planning builds the module's optimizer on a meta copy, and the first optimizer of a process imports
    ``torch._dynamo`` (seconds); under ``ddp`` that happens before the other ranks are started. A module without
    ``configure_model`` (its tensors are built) or ``example_input_array`` (nothing more to measure) that is tiny
    against the memory here fits every strategy, so the default is kept without that cost.
    """
    from stratagem.module import Module

    configure_model = getattr(type(module), "configure_model", Module.configure_model)
    if configure_model is not Module.configure_model or getattr(module, "example_input_array", None) is not None:
        return None
    tensor_bytes = sum(tensor.numel() * tensor.element_size() for tensor in (*module.parameters(), *module.buffers()))
    resources = planner.visible_resources(device)
    memory = resources.host_memory_bytes
    if resources.device_memory_bytes is not None:
        memory = min(memory, resources.device_memory_bytes)
    return tensor_bytes if tensor_bytes < memory * TRIVIAL_MEMORY_SHARE else None


@contextlib.contextmanager
def choice_for_workers(name: str) -> Iterator[None]:
    """Let the workers started in this block inherit ``name`` as the ``auto`` choice."""
    previous = os.environ.get(CHOICE_VARIABLE)
    os.environ[CHOICE_VARIABLE] = name
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(CHOICE_VARIABLE, None)
        else:
            os.environ[CHOICE_VARIABLE] = previous
