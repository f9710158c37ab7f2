"""What every XLA strategy does the same way around a step: the parallel loader (which cuts the graph), the
debug report at the end of a run."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from stratagem.precision import Precision
from stratagem.strategies import skip_parameter_init
from stratagem_xla import runtime
from stratagem_xla.loading import parallel_loader_batches


def feed(batches: Iterator[Any], device: torch.device, input_sharding: Any = None) -> Iterator[Any]:
    return parallel_loader_batches(batches, device, input_sharding)


def print_debug_metrics() -> None:
    """XLA's metrics report (compilations, executions, transfers, ops that fell back to the CPU) on stdout."""
    import torch_xla.debug.metrics as met

    print(met.metrics_report(), flush=True)


def xla_device() -> torch.device:
    """This process's XLA device, torch_xla imported (or a ``RuntimeError`` saying why it cannot be)."""
    runtime.require_xla()
    import torch_xla

    return torch.device(torch_xla.device())


@contextlib.contextmanager
def cpu_module_init(precision: Precision, empty_init: bool | None) -> Iterator[None]:
    """Modules created on the CPU (in the precision's dtype), moved to the device by ``setup_module``.

    Not on the XLA device: its random generator is not the CPU's, so weights built there with the same seed
    would differ from those any other strategy builds, and a module created on it is traced op by op.
    """
    with contextlib.ExitStack() as stack:
        if empty_init:
            stack.enter_context(skip_parameter_init())
        stack.enter_context(precision.module_init_context())
        yield
