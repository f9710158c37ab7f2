"""DDPStrategy: one process per device, gradients averaged by torch's DistributedDataParallel."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer

from stratagem.mesh import MeshLayout
from stratagem.strategies import (
    BackwardSyncControl,
    LayoutSharding,
    LoopSettings,
    MemoryEstimate,
    ModelFootprint,
    ParallelOptions,
    ParallelStrategy,
    PreparesEachBackward,
    TakesLoopSettings,
    replicated_estimate,
)
from stratagem_ddp.comm_hooks import (
    CommHook,
    build_comm_state,
    check_comm_hook_options,
    check_single_bucket,
    create_model_averager,
    register_comm_hook,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack


class DDPStrategy(ParallelStrategy, BackwardSyncControl, PreparesEachBackward, TakesLoopSettings):
    """Data-parallel training with one process per device and DDP's bucketed gradient all-reduce.

    Options, beyond those of :class:`~stratagem.strategies.ParallelStrategy`:

    - ``start_method``: how ranks start: ``"popen"`` re-runs the command (``ddp``), ``"spawn"``,
      ``"fork"`` or ``"forkserver"`` start them from the calling process. Ranks started by
      torchrun, SLURM or MPI are joined whatever this says.
    - ``find_unused_parameters``, ``static_graph``, ``gradient_as_bucket_view``,
      ``bucket_cap_mb``: passed to ``DistributedDataParallel``.
    - ``ddp_comm_hook`` (e.g. ``fp16_compress_hook``, ``powerSGD_hook``), its
      ``ddp_comm_state`` (an object, or a function without arguments that builds it in each
      rank) and a ``ddp_comm_wrapper`` (e.g. ``fp16_compress_wrapper``).
    - ``model_averaging_period``: with ``post_localSGD_hook``, average the models every N
      optimizer steps once local SGD starts (steps a precision skips, on an inf gradient, not counted).

    Its layout of core's mesh (:mod:`stratagem.mesh`) is ``dp_replicate`` over every rank: each worker builds that
    mesh, which the module reads as ``self.device_mesh``; DDP all-reduces over ``device_mesh["dp_replicate"]``.

    Subclasses customise the process group by overriding :meth:`init_dist_connection` and
    the wrapping by overriding :meth:`configure_ddp`.
    """

    def __init__(
        self,
        *,
        find_unused_parameters: bool = False,
        static_graph: bool = False,
        gradient_as_bucket_view: bool = False,
        bucket_cap_mb: float | None = None,
        ddp_comm_state: Any = None,
        ddp_comm_hook: CommHook | None = None,
        ddp_comm_wrapper: Callable[[CommHook], CommHook] | None = None,
        model_averaging_period: int | None = None,
        **parallel_options: Unpack[ParallelOptions],
    ) -> None:
        super().__init__(**parallel_options)
        for option, value in (
            ("find_unused_parameters", find_unused_parameters),
            ("static_graph", static_graph),
            ("gradient_as_bucket_view", gradient_as_bucket_view),
        ):
            if not isinstance(value, bool):
                raise TypeError(f"{option}={value!r} is not valid; expected True or False.")
        if bucket_cap_mb is not None and (
            isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, int | float) or bucket_cap_mb <= 0
        ):
            raise ValueError(f"bucket_cap_mb={bucket_cap_mb!r} is not valid; expected a positive number (MiB) or None.")
        if model_averaging_period is not None and (
            isinstance(model_averaging_period, bool)
            or not isinstance(model_averaging_period, int)
            or model_averaging_period < 1
        ):
            raise ValueError(
                f"model_averaging_period={model_averaging_period!r} is not valid; expected a positive int or None."
            )
        for option, function in (("ddp_comm_hook", ddp_comm_hook), ("ddp_comm_wrapper", ddp_comm_wrapper)):
            if function is not None and not callable(function):
                raise TypeError(f"{option}={function!r} is not valid; expected a function (or None).")
        self.find_unused_parameters = find_unused_parameters
        self.static_graph = static_graph
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.bucket_cap_mb = bucket_cap_mb
        self.ddp_comm_state = ddp_comm_state
        self.ddp_comm_hook = ddp_comm_hook
        self.ddp_comm_wrapper = ddp_comm_wrapper
        self.model_averaging_period = model_averaging_period
        self._model_averager: Any = None
        self._averaging_hooks: list[Any] = []
        self._mesh_layout = MeshLayout(dp_replicate=-1, dp_shard=1)

    def complete_configuration(self) -> None:
        check_comm_hook_options(
            hook=self.ddp_comm_hook,
            wrapper=self.ddp_comm_wrapper,
            state=self.ddp_comm_state,
            backend=self.process_group_backend,
            bucket_cap_mb=self.bucket_cap_mb,
            model_averaging_period=self.model_averaging_period,
        )

    def connect_loop_settings(self, settings: LoopSettings) -> None:
        if self.static_graph and settings.accumulate_grad_batches > 1:
            raise ValueError(
                f"accumulate_grad_batches={settings.accumulate_grad_batches} skips gradient sync on all but the last "
                "batch (DDP.no_sync), which DDP does not support with static_graph=True. Use "
                "accumulate_grad_batches=1 or static_graph=False."
            )
        super().connect_loop_settings(settings)

    def estimate_memory(self, footprint: ModelFootprint) -> MemoryEstimate:
        estimate = replicated_estimate(footprint)
        if self.gradient_as_bucket_view:
            return estimate
        # The reducer's buckets hold a second copy of every gradient unless gradients are views into them.
        return dataclasses.replace(estimate, device_bytes=estimate.device_bytes + footprint.gradient_bytes)

    def layout_sharding(self, devices_per_node: int) -> LayoutSharding:
        layout = LayoutSharding(dimensions=("dp_replicate",), default={"dp_replicate": -1})
        return layout if self.gradient_as_bucket_view else dataclasses.replace(layout, buffers=_reducer_buckets)

    def setup_module(self, module: nn.Module) -> nn.Module:
        module = super().setup_module(module)
        backend = self.process_group_backend
        check_single_bucket(module, self.ddp_comm_hook, backend, self.bucket_cap_mb)
        model = self.configure_ddp(module)
        state = build_comm_state(self.ddp_comm_state, self.ddp_comm_hook, backend)
        register_comm_hook(model, state, self.ddp_comm_hook, self.ddp_comm_wrapper)
        if self.model_averaging_period is not None:
            self._model_averager = create_model_averager(state, self.model_averaging_period)
        self._model = model
        return model

    def configure_ddp(self, module: nn.Module) -> DistributedDataParallel:
        """Wrap ``module`` (already on :attr:`root_device`) in ``DistributedDataParallel``.

        Override to pass other arguments to DDP or to use a subclass of it; comm hooks are
        registered on what this returns.
        """
        options: dict[str, Any] = {
            "find_unused_parameters": self.find_unused_parameters,
            "static_graph": self.static_graph,
            "gradient_as_bucket_view": self.gradient_as_bucket_view,
        }
        if self.bucket_cap_mb is not None:
            options["bucket_cap_mb"] = self.bucket_cap_mb
        device_ids = [self.root_device.index] if self.root_device.type == "cuda" else None
        process_group = self._replicas_group()
        return DistributedDataParallel(module, device_ids=device_ids, process_group=process_group, **options)

    def _replicas_group(self) -> Any:
        """The process group of the mesh's ``"dp_replicate"`` ranks, which hold the copies DDP keeps in step."""
        mesh = self.device_mesh
        assert mesh is not None  # DDPStrategy always has a layout: device_mesh raises until it is built
        return mesh["dp_replicate"].get_group()

    def explain_backward_failure(self, error: RuntimeError) -> None:
        if not _is_communication_error(error):
            return
        # Re-raised inside collective() so that it is reported like any other stuck collective.
        with self.collective("all_reduce of gradients (DDP, during backward)"):
            raise error

    def prepare_backward(self, loss: Any) -> None:
        model = self.model
        if not isinstance(model, DistributedDataParallel) or not torch.is_grad_enabled():
            return
        if not model.require_backward_grad_sync:
            return
        model.require_forward_param_sync = True
        # What DDP's forward does for its output, done for this loss: with find_unused_parameters the reducer
        # walks this loss's graph, so the parameters another backward of the step uses count as unused here.
        finds_unused = model.find_unused_parameters and not model.static_graph
        reducer = model.reducer
        try:
            reducer._rebuild_buckets()  # as DDP's forward does before it prepares
            reducer.prepare_for_backward([loss] if finds_unused else [])
        except RuntimeError as error:
            if finds_unused or "Expected to have finished reduction" not in str(error):
                raise
            raise RuntimeError(
                "Under manual optimization the last manual_backward left some parameters without a gradient (the "
                "other optimizer's, frozen by toggle_optimizer, or a model the loss did not use), and DDP waits for "
                "every parameter before it averages any: its optimizer stepped unaveraged gradients. Use "
                "strategy='ddp_find_unused_parameters_true' (DDPStrategy(find_unused_parameters=True)), which finds "
                "them from each loss."
            ) from error

    def no_backward_sync(self, enabled: bool) -> contextlib.AbstractContextManager[Any]:
        if not enabled or not isinstance(self.model, DistributedDataParallel):
            return contextlib.nullcontext()
        if self.static_graph:
            raise RuntimeError(
                "Skipping gradient sync (DDP.no_sync) is not supported with static_graph=True; "
                "use static_graph=False to accumulate gradients."
            )
        return self.model.no_sync()

    def setup_optimizers(self, optimizers: list[Optimizer]) -> list[Optimizer]:
        optimizers = super().setup_optimizers(optimizers)
        self._remove_averaging_hooks()
        averager = self._model_averager
        if averager is not None:
            # After each step the optimizer takes (one a precision skips is not one), as a hook of the optimizer
            # rather than an optimizer_step of ours: DDP's step stays the optimizer's own, which the loops call
            # without a frame per step (strategies/step_calls.py).
            def average(optimizer: Optimizer, args: Any, kwargs: Any) -> None:
                parameters = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
                averager.average_parameters(iter(parameters))

            self._averaging_hooks = [optimizer.register_step_post_hook(average) for optimizer in optimizers]
        return optimizers

    def _remove_averaging_hooks(self) -> None:
        for handle in self._averaging_hooks:
            handle.remove()
        self._averaging_hooks = []

    def teardown(self) -> None:
        self._model = self._module
        self._model_averager = None
        self._remove_averaging_hooks()
        # A DDP wrapper whose comm hook (powerSGD) outlived the process group aborted the
        # process at exit on gloo; collect it while the group still exists.
        gc.collect()
        super().teardown()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(devices={self.num_processes}, num_nodes={self.num_nodes}, "
            f"start_method={self.start_method!r}, process_group_backend={self._process_group_backend or 'auto'!r})"
        )


def _is_communication_error(error: RuntimeError) -> bool:
    """Whether an error out of backward came from the process group (a peer gone, a timeout)."""
    message = str(error)
    return any(marker in message for marker in ("gloo", "NCCL", "Connection closed", "Timed out", "timed out"))


def _reducer_buckets(footprint: ModelFootprint, shard_ranks: int) -> int:
    # Without gradient_as_bucket_view the reducer's buckets hold a second copy of every gradient.
    return footprint.gradient_bytes
