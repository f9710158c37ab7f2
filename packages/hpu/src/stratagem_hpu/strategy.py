"""The Gaudi strategies: ``hpu_single`` (one card) and ``hpu_parallel`` / ``hpu_ddp`` (one process per card, DDP
over HCCL), and what every HPU strategy shares (:class:`HPUStrategy`), which the FSDP and DeepSpeed compositions
reuse."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import nn
from typing_extensions import Unpack

from stratagem.strategies import (
    ChecksRunBeforeLaunch,
    ParallelOptions,
    ReduceOp,
    SingleDeviceStrategy,
    StepBoundary,
    StepBoundaryListener,
    Strategy,
    StrategyOptions,
)
from stratagem.strategies.collective_arguments import reduce_operation
from stratagem_ddp import DDPStrategy
from stratagem_hpu import availability, habana
from stratagem_hpu.checkpoint_io import HPUCheckpointIO
from stratagem_hpu.execution import (
    LAZY_MODE_VARIABLE,
    ExecutionMode,
    check_execution_mode,
    compile_module,
    cut_graph,
    set_lazy_mode_variable,
)


class HPUStrategy(Strategy, StepBoundaryListener, ChecksRunBeforeLaunch):
    """What every Gaudi strategy adds to the strategy it is built on, placed before it in the class's bases.

    - ``execution_mode``: ``"lazy"`` (Habana's default) records operations and runs them as one graph at each
      ``mark_step``, which comes where Habana documents it: after backward, after each optimizer step and
      before every evaluation step (told by the Trainer at those step boundaries); ``"eager"`` runs each
      operation at once; ``"compile"`` runs eagerly with the module compiled by
      ``torch.compile(backend="hpu_backend")``. ``None`` follows ``PT_HPU_LAZY_MODE`` (lazy unless ``0``).
    - ``hpu_graphs``: for ``validate``/``test``/``predict``, record the module's forward once as an HPU graph
      and replay it (Habana's ``wrap_in_hpu_graph``, an inference feature: ``fit`` refuses it before any
      process starts).
    - HCCL reduces no integer tensors and has no mean: integer tensors are reduced as float32 (a mean stays
      float; a sum, max or min comes back in the tensor's dtype) and a mean is a sum divided by the world size.
    """

    execution_mode: ExecutionMode
    hpu_graphs: bool

    @staticmethod
    def is_available() -> bool:
        return availability.habana_problem() is None

    @staticmethod
    def unavailable_reason() -> str:
        return availability.habana_problem() or "Habana's software is installed"

    def _take_hpu_options(self, execution_mode: ExecutionMode | None, hpu_graphs: bool) -> None:
        if execution_mode is None:
            execution_mode = "eager" if os.environ.get(LAZY_MODE_VARIABLE) == "0" else "lazy"
        self.execution_mode = check_execution_mode(execution_mode)
        if not isinstance(hpu_graphs, bool):
            raise TypeError(f"hpu_graphs={hpu_graphs!r} is not valid; expected True or False.")
        self.hpu_graphs = hpu_graphs

    def complete_configuration(self) -> None:
        super().complete_configuration()
        if self.accelerator.device_type != "hpu":
            raise ValueError(
                f"{type(self).__name__} runs on Gaudi cards, but accelerator={self.accelerator.device_type!r}. "
                "Use accelerator='hpu' (or 'auto' where Habana's software is installed)."
            )
        if self.precision.param_dtype == torch.float64:
            raise ValueError(
                f"precision={self.precision.name!r} computes in float64, which Gaudi cards do not. "
                "Use '32-true', 'bf16-mixed', 'bf16-true' or 'fp8'."
            )
        set_lazy_mode_variable(self.execution_mode)

    def at_step_boundary(self, boundary: StepBoundary) -> None:
        if self.execution_mode == "lazy":
            cut_graph()

    def setup_module(self, module: nn.Module) -> nn.Module:
        model = super().setup_module(module)
        if self.execution_mode == "compile":
            compile_module(self.module)
        if self.hpu_graphs:
            habana.hpu().wrap_in_hpu_graph(self.module)
        return model

    def check_run(self, stage: Literal["fit", "validate", "test", "predict"]) -> None:
        if self.hpu_graphs and stage == "fit":
            raise ValueError(
                "hpu_graphs=True replays a recorded inference graph, which cannot train: use it for validate, "
                "test and predict, and fit with hpu_graphs=False."
            )

    def reduce(self, tensor: Any, op: ReduceOp = "mean", *, group: Any = None, reduce_op: Any = None) -> Any:
        op = reduce_operation(op, reduce_op)
        # super() is the strategy HPUStrategy is mixed into, which implements reduce.
        if not isinstance(tensor, torch.Tensor) or tensor.is_floating_point() or tensor.is_complex():
            return super().reduce(tensor, op, group=group)  # type: ignore[safe-super]
        reduced = super().reduce(tensor.to(torch.float32), op, group=group)  # type: ignore[safe-super]
        return reduced if op == "mean" else reduced.to(tensor.dtype)


class HPUSingleStrategy(HPUStrategy, SingleDeviceStrategy):
    """One Gaudi card in this process (``hpu_single``). Options: see :class:`HPUStrategy`."""

    def __init__(
        self,
        device: torch.device | str | int | None = None,
        *,
        execution_mode: ExecutionMode | None = None,
        hpu_graphs: bool = False,
        **strategy_options: Unpack[StrategyOptions],
    ) -> None:
        super().__init__(device, **strategy_options)
        self._take_hpu_options(execution_mode, hpu_graphs)

    def complete_configuration(self) -> None:
        super().complete_configuration()
        self._checkpoint_io = self._checkpoint_io or HPUCheckpointIO()

    def __repr__(self) -> str:
        return f"HPUSingleStrategy(execution_mode={self.execution_mode!r}, hpu_graphs={self.hpu_graphs})"


class DDPOptions(ParallelOptions, total=False):
    """The options ``stratagem_ddp.DDPStrategy`` takes beyond the parallel ones, for the type checker: at run time
    the accepted names are read from DDPStrategy's signature (a test holds the two equal)."""

    find_unused_parameters: bool
    static_graph: bool
    gradient_as_bucket_view: bool
    bucket_cap_mb: float | None
    ddp_comm_state: Any
    ddp_comm_hook: Callable[[Any, Any], Any] | None
    ddp_comm_wrapper: Callable[[Callable[[Any, Any], Any]], Callable[[Any, Any], Any]] | None
    model_averaging_period: int | None


class HPUDistributed(HPUStrategy):
    """What an HPU strategy of several processes adds to :class:`HPUStrategy`: each process calls Habana's
    ``initialize_distributed_hpu`` with its ranks before joining the ``hccl`` process group."""

    def setup_environment(self) -> None:
        initialize_distributed_hpu(self)
        super().setup_environment()


class HPUParallelStrategy(HPUDistributed, DDPStrategy):
    """One process per Gaudi card, gradients all-reduced by DDP over HCCL (``hpu_parallel``, ``hpu_ddp``).
    Options: those of :class:`HPUStrategy` and of ``stratagem_ddp.DDPStrategy``.
    """

    def __init__(
        self,
        *,
        execution_mode: ExecutionMode | None = None,
        hpu_graphs: bool = False,
        **ddp_options: Unpack[DDPOptions],
    ) -> None:
        super().__init__(**ddp_options)
        self._take_hpu_options(execution_mode, hpu_graphs)

    def complete_configuration(self) -> None:
        super().complete_configuration()
        self._checkpoint_io = self._checkpoint_io or HPUCheckpointIO()


def initialize_distributed_hpu(strategy: Strategy) -> None:
    """Habana's step before the ``hccl`` process group: tell the bridge this process's ranks (importing the
    module registers the ``hccl`` backend with ``torch.distributed``)."""
    habana.hccl().initialize_distributed_hpu(
        world_size=strategy.world_size, rank=strategy.global_rank, local_rank=strategy.local_rank
    )
