"""Measure a module's training footprint without allocating it: build a copy on the meta device."""

from __future__ import annotations

import contextlib
import copy
import itertools
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from stratagem.precision import Precision
from stratagem.printable import raised_at
from stratagem.strategies.memory import ModelFootprint

DEFAULT_STATES_PER_ELEMENT = 2
"""Optimizer state tensors per trainable element assumed when the optimizer is unknown (AdamW's two moments)."""


def model_footprint(
    module: nn.Module, precision: Precision | None = None, activations: bool = True
) -> tuple[ModelFootprint, list[str]]:
    """The footprint of ``module`` once ``configure_model`` has run, with notes on what was assumed.

    The user's module is left untouched: a copy whose existing tensors are meta tensors runs
    ``configure_model`` on the meta device (in ``precision``'s parameter dtype), then
    ``configure_optimizers`` and, when the module has an ``example_input_array`` and ``activations`` is true,
    one forward.
    """
    precision = precision or Precision()
    notes: list[str] = []
    meta_module = _meta_copy(module)
    configure_model = getattr(meta_module, "configure_model", None)
    if callable(configure_model):
        try:
            with torch.device("meta"), precision.module_init_context():
                configure_model()
        except Exception as error:  # the user's code: say whose and where, the traceback stays on the chain
            raise ValueError(
                f"{type(module).__name__}.configure_model() failed on the meta device: {raised_at(error)}"
            ) from error
    parameters = list(meta_module.parameters())
    trainable = [parameter for parameter in parameters if parameter.requires_grad]
    states = _optimizer_states_per_element(meta_module, notes)
    gradient_bytes = sum(_bytes(parameter) for parameter in trainable)
    return (
        ModelFootprint(
            parameters=sum(parameter.numel() for parameter in parameters),
            parameter_bytes=sum(_bytes(parameter) for parameter in parameters),
            gradient_bytes=gradient_bytes,
            optimizer_state_bytes=int(states * gradient_bytes),
            activation_bytes=_activation_bytes(meta_module, notes) if activations else 0,
            largest_unit_bytes=_largest_unit_bytes(meta_module),
            module=meta_module,
        ),
        notes,
    )


def _meta_copy(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` in which every parameter and buffer is a meta tensor of the same shape and dtype;
    anything the module refers to that is not a tensor or submodule (a trainer, a run context) is shared."""
    memo: dict[int, Any] = {}
    for name in ("_trainer", "_run_context"):
        referenced = getattr(module, name, None)
        if referenced is not None:
            memo[id(referenced)] = referenced
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        meta = torch.empty_like(tensor, device="meta")
        memo[id(tensor)] = nn.Parameter(meta, tensor.requires_grad) if isinstance(tensor, nn.Parameter) else meta
    return copy.deepcopy(module, memo)


def _optimizer_states_per_element(module: nn.Module, notes: list[str]) -> float:
    optimizers = _configured_optimizers(module, notes)
    if not optimizers:
        return DEFAULT_STATES_PER_ELEMENT
    per_optimizer = [_states_of(optimizer, notes) for optimizer in optimizers]
    return max(per_optimizer)


def _configured_optimizers(module: nn.Module, notes: list[str]) -> list[Optimizer]:
    from stratagem.trainer.optimizers import configured_optimizers

    if not callable(getattr(module, "configure_optimizers", None)):
        notes.append(f"no configure_optimizers: assumed {DEFAULT_STATES_PER_ELEMENT} optimizer states per element")
        return []
    try:
        return configured_optimizers(module, strategy_supplies_optimizer=True).optimizers
    except Exception as error:  # the user's code ran on meta tensors; any failure only makes the estimate rougher
        notes.append(
            f"configure_optimizers failed on the meta device ({type(error).__name__}: {error}): "
            f"assumed {DEFAULT_STATES_PER_ELEMENT} optimizer states per element"
        )
        return []


def _states_of(optimizer: Optimizer, notes: list[str]) -> float:
    """State tensors per element the optimizer keeps, from its documented algorithm and its settings."""
    defaults = optimizer.defaults
    if isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
        return 3 if defaults.get("amsgrad") else 2
    if isinstance(optimizer, torch.optim.SGD):
        return 1 if defaults.get("momentum") else 0
    if isinstance(optimizer, torch.optim.RMSprop):
        return 1 + bool(defaults.get("momentum")) + bool(defaults.get("centered"))
    if isinstance(optimizer, torch.optim.Adagrad):
        return 1
    if isinstance(optimizer, torch.optim.Adamax | torch.optim.NAdam | torch.optim.RAdam):
        return 2
    notes.append(f"{type(optimizer).__name__}: assumed {DEFAULT_STATES_PER_ELEMENT} optimizer states per element")
    return DEFAULT_STATES_PER_ELEMENT


def _activation_bytes(module: nn.Module, notes: list[str]) -> int:
    example = getattr(module, "example_input_array", None)
    if example is None:
        notes.append("activations not counted: the module has no example_input_array")
        return 0
    total = 0

    def count(_: nn.Module, __: Any, output: Any) -> None:
        nonlocal total
        total += sum(_bytes(tensor) for tensor in _tensors(output))

    leaves = [submodule for submodule in module.modules() if next(submodule.children(), None) is None]
    with _hooked(leaves, count):
        try:
            arguments = _to_meta(example)
            if isinstance(arguments, tuple):
                module(*arguments)
            elif isinstance(arguments, dict):
                module(**arguments)
            else:
                module(arguments)
        except Exception as error:  # a forward that needs real data (e.g. .item()) cannot run on meta tensors
            notes.append(f"activations not counted: forward on the meta device failed ({type(error).__name__})")
            return 0
    return total


@contextlib.contextmanager
def _hooked(modules: list[nn.Module], hook: Any) -> Iterator[None]:
    handles = [submodule.register_forward_hook(hook) for submodule in modules]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _largest_unit_bytes(module: nn.Module) -> int:
    blocks = [
        child
        for container in module.modules()
        if isinstance(container, nn.ModuleList | nn.Sequential)
        for child in container.children()
    ]
    sizes = [sum(_bytes(parameter) for parameter in block.parameters()) for block in blocks]
    return max(sizes, default=0) or sum(_bytes(parameter) for parameter in module.parameters())


def _to_meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.empty_like(value, device="meta")
    if isinstance(value, tuple | list):
        return type(value)(_to_meta(item) for item in value)
    if isinstance(value, dict):
        return {key: _to_meta(item) for key, item in value.items()}
    return value


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, tuple | list):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def _bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()
