"""What one rank of ``fully_shard`` holds: its shards, the units it gathers at once, and its activations."""

from __future__ import annotations

from torch import nn

from stratagem.strategies import MemoryEstimate, ModelFootprint
from stratagem_fsdp.options import ModuleSelector, ShardingLayout
from stratagem_fsdp.wrapping import selected_units

SHARDED_STEP_TIME = 1.1
"""Gathering parameters and reduce-scattering gradients costs a little over DDP's all-reduce."""
OFFLOADED_STEP_TIME = 1.6
"""Copying every shard between host and device, and stepping on the host."""
RELEASING_STEP_TIME = 1.35
"""How much longer a step takes when freed memory goes back to the system at once (FSDP on the CPU, 109M
parameters, 6 steps: 4.27 s against 3.17 s with CPU offload, 6.41 against 4.73 without)."""


def fsdp_estimate(
    footprint: ModelFootprint, layout: ShardingLayout, auto_wrap: ModuleSelector | None, offload: bool
) -> MemoryEstimate:
    """Shards are the training state over the shard group; a unit's parameters and gradients are whole while it
    computes (the largest unit and the prefetched next one), and the root's own parameters for the whole step.
    Without resharding after forward (``SHARD_GRAD_OP``) every unit stays gathered until backward."""
    shard_ranks = layout.mesh_shape[-1]
    gathered = gathered_bytes(
        footprint, shard_ranks, auto_wrap=auto_wrap, reshard_after_forward=layout.reshard_after_forward
    )
    shards = footprint.training_state_bytes // shard_ranks
    if offload:
        return MemoryEstimate(
            device_bytes=gathered + footprint.activation_bytes,
            host_bytes=shards,
            relative_step_time=OFFLOADED_STEP_TIME,
        )
    return MemoryEstimate(
        device_bytes=shards + gathered + footprint.activation_bytes,
        relative_step_time=SHARDED_STEP_TIME if shard_ranks > 1 else 1.0,
    )


def gathered_bytes(
    footprint: ModelFootprint, shard_ranks: int, *, auto_wrap: ModuleSelector | None, reshard_after_forward: bool
) -> int:
    """The parameters (and their whole gradients) a rank holds gathered at once while a unit computes."""
    if shard_ranks <= 1:
        return 0
    element_bytes = footprint.parameter_bytes / max(1, footprint.parameters)
    unit_sizes, root_size = _unit_sizes(footprint, auto_wrap)
    if not reshard_after_forward:
        gathered_elements = footprint.parameters
    else:
        largest_two = sum(sorted(unit_sizes, reverse=True)[:2])
        gathered_elements = root_size + largest_two
    # A gathered unit's gradient is whole until it is reduce-scattered.
    return int(2 * gathered_elements * element_bytes)


def _unit_sizes(footprint: ModelFootprint, auto_wrap: ModuleSelector | None) -> tuple[list[int], int]:
    """Parameter counts of the units ``auto_wrap`` selects, and of what is left to the root."""
    if footprint.module is None:
        return [], footprint.parameters
    units = selected_units(footprint.module, auto_wrap)
    sizes: list[int] = []
    counted: set[int] = set()
    for unit in units:
        own = [parameter for parameter in unit.parameters() if id(parameter) not in counted]
        counted.update(id(parameter) for parameter in own)
        sizes.append(sum(parameter.numel() for parameter in own))
    return sizes, footprint.parameters - sum(sizes)


def built_footprint(module: nn.Module) -> ModelFootprint:
    """The footprint of a module already built, before it is sharded: AdamW's two moments per trainable element,
    activations not counted (what decides ``release_host_memory=None`` in ``setup_module``)."""
    parameters = list(module.parameters())
    parameter_bytes = sum(parameter.numel() * parameter.element_size() for parameter in parameters)
    gradient_bytes = sum(p.numel() * p.element_size() for p in parameters if p.requires_grad)
    return ModelFootprint(
        parameters=sum(parameter.numel() for parameter in parameters),
        parameter_bytes=parameter_bytes,
        gradient_bytes=gradient_bytes,
        optimizer_state_bytes=2 * gradient_bytes,
        activation_bytes=0,
        largest_unit_bytes=parameter_bytes,
        module=module,
    )
