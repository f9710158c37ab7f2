"""What one micro-batch costs a model: its activations, its FLOPs and what each block hands the next, measured by
one forward on the meta device (nothing is allocated)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from stratagem.planning.footprint import _bytes, _hooked, _tensors, _to_meta, model_footprint
from stratagem.precision import Precision
from stratagem.strategies.memory import ModelFootprint


@dataclass(frozen=True)
class Workload:
    """A model's training state and the cost of one forward of one micro-batch."""

    footprint: ModelFootprint
    """Parameters, gradients and optimizer state; ``activation_bytes`` is that of the micro-batch below."""
    micro_batch: tuple[int, ...] | None
    """The shape of the input measured (``(batch, seq_len)`` of token ids), ``None`` when it is not one tensor."""
    forward_flops: int
    """FLOPs of one forward of the micro-batch, as torch's ``FlopCounterMode`` counts them (attention included)."""
    compute_element_bytes: float = 4.0
    """Bytes per element of what the forward computes and sends: the precision's 16-bit dtype under mixed
    precision, else the parameters' size."""
    block_output_bytes: list[int] = field(default_factory=list)
    """What each repeated block (an element of a ``ModuleList``/``Sequential``) returned: the activation a
    tensor-parallel block all-reduces, a pipeline stage sends on, and activation checkpointing keeps."""
    block_activation_bytes: list[int] = field(default_factory=list)
    """The leaf outputs inside each repeated block: what activation checkpointing recomputes instead of keeping."""
    block: nn.Module | None = field(default=None, compare=False, repr=False)
    """The first repeated block, built on the meta device: what a strategy's policies are asked about."""
    notes: list[str] = field(default_factory=list)


def measure_workload(
    module: nn.Module, precision: Precision | None = None, batch_size: int | None = None, seq_len: int | None = None
) -> Workload:
    """Build ``module`` on the meta device (as :func:`model_footprint` does) and run one forward of token ids of
    shape ``(batch_size, seq_len)``, or of its ``example_input_array`` when neither is given."""
    precision = precision or Precision()
    footprint, notes = model_footprint(module, precision, activations=False)
    meta_module = footprint.module
    assert meta_module is not None
    example = micro_batch_input(module, batch_size, seq_len)
    if example is None:
        notes.append("activations and FLOPs not counted: the module has no example_input_array (or give --seq-len)")
        return Workload(footprint, None, 0, notes=notes)
    parameter_element = footprint.parameter_bytes / max(1, footprint.parameters)
    compute_element = _compute_element_bytes(precision, parameter_element)
    costs = _forward_costs(meta_module, example, precision, notes)
    # Autocast does not act on meta tensors: the outputs were measured in the parameters' dtype.
    scale = compute_element / parameter_element
    activations = int(costs.activations * scale)
    outputs = [int(size * scale) for size in costs.block_outputs]
    inside = [int(size * scale) for size in costs.block_activations]
    footprint = _with_activations(footprint, activations)
    shape = tuple(example.shape) if isinstance(example, torch.Tensor) else None
    first_block = next(iter(repeated_blocks(meta_module)), None)
    return Workload(footprint, shape, costs.flops, compute_element, outputs, inside, first_block, notes)


def _compute_element_bytes(precision: Precision, parameter_element: float) -> float:
    dtype = getattr(precision, "dtype", None)  # a mixed precision's autocast dtype
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point and dtype.itemsize < parameter_element:
        return float(dtype.itemsize)
    return parameter_element


def micro_batch_input(module: nn.Module, batch_size: int | None, seq_len: int | None) -> Any:
    """Token ids of ``(batch_size, seq_len)`` (zeros), or the module's ``example_input_array`` when neither is
    given; ``ValueError`` when the module's example input is not token ids of that shape."""
    example = getattr(module, "example_input_array", None)
    if batch_size is None and seq_len is None:
        return example
    if example is not None and not (
        isinstance(example, torch.Tensor) and example.dim() == 2 and not example.is_floating_point()
    ):
        shown = (
            f"a {example.dtype} tensor of shape {tuple(example.shape)}"
            if isinstance(example, torch.Tensor)
            else type(example).__name__
        )
        raise ValueError(
            f"--seq-len/--batch-size make the micro-batch token ids of shape (batch, seq_len), but the module's "
            f"example_input_array is {shown}; leave both out to measure the module's own example input."
        )
    default_batch, default_length = example.shape if example is not None else (1, 1)
    return torch.zeros(batch_size or int(default_batch), seq_len or int(default_length), dtype=torch.long)


@dataclass(frozen=True)
class _ForwardCosts:
    activations: int = 0
    flops: int = 0
    block_outputs: list[int] = field(default_factory=list)
    block_activations: list[int] = field(default_factory=list)


def _forward_costs(module: nn.Module, example: Any, precision: Precision, notes: list[str]) -> _ForwardCosts:
    from torch.utils.flop_counter import FlopCounterMode

    blocks = repeated_blocks(module)
    leaves = [submodule for submodule in module.modules() if next(submodule.children(), None) is None]
    block_of = {id(leaf): index for index, block in enumerate(blocks) for leaf in block.modules()}
    outputs = [0] * len(blocks)
    inside = [0] * len(blocks)
    activations = 0

    def count_leaf(leaf: nn.Module, __: Any, output: Any) -> None:
        nonlocal activations
        size = sum(_bytes(tensor) for tensor in _tensors(output))
        activations += size
        if id(leaf) in block_of:
            inside[block_of[id(leaf)]] += size

    def count_block(block: nn.Module, __: Any, output: Any) -> None:
        outputs[blocks.index(block)] += sum(_bytes(tensor) for tensor in _tensors(output))

    counter = FlopCounterMode(display=False)
    with _hooked(leaves, count_leaf), _hooked(blocks, count_block), counter, precision.forward_context():
        try:
            with torch.no_grad():
                _call(module, _to_meta(example))
        except Exception as error:  # a forward that needs real data (e.g. .item()) cannot run on meta tensors
            notes.append(f"activations and FLOPs not counted: forward on the meta device failed ({error})")
            return _ForwardCosts()
    return _ForwardCosts(activations, int(counter.get_total_flops()), outputs, inside)


def repeated_blocks(module: nn.Module) -> list[nn.Module]:
    """The elements of the module's largest ``ModuleList``/``Sequential`` (a decoder's layers)."""
    container = blocks_container(module)
    return list(container.children()) if container is not None else []


def blocks_container(module: nn.Module) -> nn.ModuleList | nn.Sequential | None:
    """The module's largest ``ModuleList``/``Sequential`` when it holds more than one block."""
    containers = [child for child in module.modules() if isinstance(child, nn.ModuleList | nn.Sequential)]
    largest = max(containers, key=len, default=None)
    return largest if largest is not None and len(largest) > 1 else None


def _call(module: nn.Module, arguments: Any) -> Any:
    if isinstance(arguments, tuple):
        return module(*arguments)
    if isinstance(arguments, dict):
        return module(**arguments)
    return module(arguments)


def _with_activations(footprint: ModelFootprint, activation_bytes: int) -> ModelFootprint:
    from dataclasses import replace

    return replace(footprint, activation_bytes=activation_bytes)
