"""Optimizer state keyed by parameter name (how torch.distributed.checkpoint keeps it) or by index (plain torch).

A plain ``Optimizer.state_dict()`` numbers parameters 0, 1, ... across its parameter groups
in order; ``get_optimizer_state_dict`` names them by their fully qualified parameter names
instead, which survives resharding. Checkpoints meant for any strategy hold the plain form.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.optim import Optimizer


def is_name_keyed(state: object) -> bool:
    """Whether ``state`` is an optimizer state dict whose parameters are named rather than numbered."""
    if not isinstance(state, dict) or "param_groups" not in state:
        return False
    groups = state["param_groups"]
    return isinstance(groups, list) and any(
        isinstance(group, dict) and any(isinstance(key, str) for key in group.get("params", [])) for group in groups
    )


def to_index_keyed(state: dict[str, Any]) -> dict[str, Any]:
    """The plain ``Optimizer.state_dict()`` layout of a name-keyed optimizer state."""
    index_of: dict[str, int] = {}
    groups = []
    for group in state["param_groups"]:
        indices = []
        for name in group["params"]:
            index_of.setdefault(name, len(index_of))
            indices.append(index_of[name])
        groups.append({**group, "params": indices})
    per_parameter = state.get("state", {})
    return {
        "state": {index_of[name]: value for name, value in per_parameter.items() if name in index_of},
        "param_groups": groups,
    }


def to_name_keyed(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The name-keyed layout of a plain optimizer state, where ``names[i]`` is the name of parameter ``i``."""
    groups = []
    for group in state["param_groups"]:
        groups.append({**group, "params": [names[index] for index in group["params"]]})
    return {
        "state": {names[index]: value for index, value in state.get("state", {}).items()},
        "param_groups": groups,
    }


def parameter_names(module: nn.Module, optimizer: Optimizer) -> list[str]:
    """The names of ``optimizer``'s parameters in ``module``, in the order a plain state dict numbers them."""
    name_of = {id(parameter): name for name, parameter in module.named_parameters()}
    names = []
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            if id(parameter) not in name_of:
                raise ValueError(
                    "An optimizer steps a parameter that is not part of the module the strategy set up. Create "
                    "optimizers from the module's parameters after setup (in configure_optimizers)."
                )
            names.append(name_of[id(parameter)])
    return names
