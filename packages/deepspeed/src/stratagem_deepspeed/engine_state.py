"""Whole-model state into and out of a DeepSpeed engine's partitions: gathered fp32 weights, and
plain (``Optimizer.state_dict()``) optimizer state written into ZeRO's partitions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from stratagem_deepspeed.environment import import_deepspeed

if TYPE_CHECKING:
    from deepspeed import DeepSpeedEngine


def gather_module_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """The module's whole state on CPU, parameters in fp32 (the optimizer's master copy when there is
    one). A collective: every rank calls it, every rank gets the result."""
    deepspeed = import_deepspeed()
    full: dict[str, torch.Tensor] = {}
    parameters = dict(module.named_parameters(remove_duplicate=False))
    for name, value in module.state_dict(keep_vars=True).items():
        parameter = parameters.get(name)
        if parameter is None:
            full[name] = value.detach().cpu()
            continue
        gathered = deepspeed.utils.safe_get_full_fp32_param(parameter) if _has_master_copy(parameter) else None
        if gathered is None:
            with deepspeed.zero.GatheredParameters([parameter]):
                gathered = parameter.detach().to(torch.float32).clone()
        full[name] = gathered.cpu()
    return full


def load_module_state(module: nn.Module, weights: Mapping[str, torch.Tensor], strict: bool) -> None:
    """Load whole weights (every rank has them) into the module's partitions and the optimizer's master copy."""
    deepspeed = import_deepspeed()
    missing = sorted(set(module.state_dict()) - set(weights))
    unexpected = sorted(set(weights) - set(module.state_dict()))
    if strict and (missing or unexpected):
        raise RuntimeError(
            f"The checkpoint does not match the module: missing keys {missing}, unexpected keys {unexpected}. "
            "Load with strict=False to skip them."
        )
    named = dict(module.named_parameters())
    # Every rank reads the same weights; at stage 3 rank 0's copy is the one re-partitioned.
    with deepspeed.zero.GatheredParameters(list(named.values()), modifier_rank=0):
        module.load_state_dict(dict(weights), strict=False)
    for name, parameter in named.items():
        if name in weights and _has_master_copy(parameter):
            # The optimizer's fp32 master copy, which the next step would otherwise copy back.
            deepspeed.utils.safe_set_full_fp32_param(parameter, weights[name].to(torch.float32))


def _has_master_copy(parameter: nn.Parameter) -> bool:
    """Whether a ZeRO optimizer keeps an fp32 master copy of ``parameter`` (not so without an optimizer).

    At stages 1-2 every rank takes part in gathering it, also a rank whose slice of the parameter is
    empty (``_hp_mapping`` set to ``None``): testing the value instead of the attribute would hang.
    """
    return hasattr(parameter, "_z3_optimizer") or hasattr(parameter, "_hp_mapping")


def load_optimizer_state(
    engine: DeepSpeedEngine, parameter_groups: list[list[nn.Parameter]], saved: dict[str, Any]
) -> None:
    """Put a plain (whole-model) optimizer state into the engine's partitions, whatever wrote it.

    ``parameter_groups`` are the optimizer's parameters in the order a plain state numbers them.
    """
    deepspeed = import_deepspeed()
    saved_groups = saved["param_groups"]
    if [len(group["params"]) for group in saved_groups] != [len(group) for group in parameter_groups]:
        raise ValueError(
            f"The checkpoint's optimizer has groups of {[len(group['params']) for group in saved_groups]} "
            f"parameters, this run's of {[len(group) for group in parameter_groups]}; they must match."
        )
    _materialize(engine, saved)
    step = None
    for saved_group, parameters in zip(saved_groups, parameter_groups):
        for index, parameter in zip(saved_group["params"], parameters):
            for key, value in saved["state"].get(index, {}).items():
                if isinstance(value, torch.Tensor) and value.numel() == _full_numel(parameter):
                    deepspeed.utils.safe_set_full_optimizer_state(parameter, value.float(), key)
                elif key == "step":
                    step = value
    optimizer = engine.basic_optimizer
    for group, saved_group in zip(optimizer.param_groups, saved_groups):
        group.update({key: value for key, value in saved_group.items() if key != "params" and key in group})
    if step is not None:
        for state in optimizer.state.values():
            if "step" in state:
                state["step"] = step.clone() if isinstance(step, torch.Tensor) else step


def _materialize(engine: DeepSpeedEngine, saved: dict[str, Any]) -> None:
    # A torch optimizer creates its state at its first step; before that there is nothing for the
    # saved values to go into, so the entries the checkpoint has are created, zeroed, here.
    optimizer = engine.basic_optimizer
    per_parameter: dict[str, Any] = next(iter(saved["state"].values()), {})
    keys = [key for key, value in per_parameter.items() if isinstance(value, torch.Tensor) and value.dim() > 0]
    for flat in _stepped_partitions(engine):
        state = optimizer.state[flat]
        for key in keys:
            if key not in state:
                state[key] = torch.zeros_like(flat, memory_format=torch.preserve_format)
        if "step" in per_parameter and "step" not in state:
            state["step"] = torch.zeros((), dtype=torch.float32)
    # Stages 1-2 map each parameter to its slice of that state once it exists (normally after the
    # first step); the safe_set_* functions write through that mapping.
    link = getattr(engine.optimizer, "_lazy_init_hp_params_optimizer_state", None)
    if link is not None:
        link()


def _stepped_partitions(engine: DeepSpeedEngine) -> list[torch.Tensor]:
    """The flat fp32 partitions the torch optimizer steps on this rank (under ZeRO, not the module's)."""
    # Stage 3 hands its partitions to the optimizer only during a step; stages 1-2 keep them in its groups.
    for attribute in ("fp32_partitioned_groups_flat", "single_partition_of_fp32_groups"):
        partitions = getattr(engine.optimizer, attribute, None)
        if partitions is not None:
            return list(partitions)
    return [flat for group in engine.basic_optimizer.param_groups for flat in group["params"]]


def _full_numel(parameter: nn.Parameter) -> int:
    return int(getattr(parameter, "ds_numel", parameter.numel()))
