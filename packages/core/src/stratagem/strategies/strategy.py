"""The Strategy interface: how a module is placed, wrapped, stepped, synchronised and saved."""

from __future__ import annotations

import contextlib
import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypedDict

import torch
from torch import nn
from torch.optim import Optimizer

from stratagem.accelerators import Accelerator
from stratagem.checkpoint_io import CheckpointIO, PathLike
from stratagem.checkpoint_io.safetensors_import import SafetensorsWeights, copy_whole, load_pretrained_weights
from stratagem.environments.cluster_environment import ClusterEnvironment
from stratagem.launchers import Launcher
from stratagem.precision import Precision
from stratagem.strategies._batch import move_to_device
from stratagem.strategies._forward_redirect import call_through_forward
from stratagem.strategies.capabilities import adopt_legacy_capabilities
from stratagem.strategies.compilation import BlockPolicy, CompiledRegions, CompileSettings, strip_compile_prefix
from stratagem.strategies.constructor_signature import check_option_names, signature_with_forwarded_options
from stratagem.strategies.init_contexts import skip_parameter_init
from stratagem.strategies.live_state import is_optimizer_list
from stratagem.strategies.memory import LayoutSharding, MemoryEstimate, ModelFootprint, replicated_estimate

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

ReduceOp = Literal["sum", "mean", "max", "min"]


class StrategyOptions(TypedDict, total=False):
    """The options every :class:`Strategy` takes (default ``None``: the connector's choice). A subclass may take
    them as ``**strategy_options: Unpack[StrategyOptions]`` rather than re-declaring them."""

    accelerator: Accelerator | None
    precision: Precision | None
    checkpoint_io: CheckpointIO | None


class Strategy(ABC):
    """How one training run is distributed. Created by the connector, driven by :class:`stratagem.Runtime`
    (a user's own loop, and the Trainer's).

    What differs between backends is declared here as class attributes or answered by a
    method, so that callers never test a strategy's name or type. Optional abilities (skipping
    gradient sync while accumulating, an engine that owns accumulation), and what only the Trainer
    asks about (its loop settings, the schedulers it was given), are opt-in interfaces in
    :mod:`stratagem.strategies.capabilities`, which a strategy subclasses beside this class.
    """

    max_optimizers: ClassVar[int | None] = None
    """How many optimizers :meth:`setup_optimizers` accepts; ``None`` means no limit."""

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        precision: Precision | None = None,
        checkpoint_io: CheckpointIO | None = None,
    ) -> None:
        self._accelerator = accelerator
        self._precision = precision
        self._checkpoint_io = checkpoint_io
        self._module: nn.Module | None = None
        self._model: nn.Module | None = None
        self._in_run = False
        self._compiled_regions: CompiledRegions | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        adopt_legacy_capabilities(cls)
        # What help(), the registry's option check and __new__ read: a subclass's own options and those it forwards.
        setattr(cls, "__signature__", signature_with_forwarded_options(cls))  # noqa: B010 - not a declared attribute

    def __new__(cls, *args: Any, **options: Any) -> Strategy:
        # Checked before __init__, so that an unknown keyword names this class and what it accepts, not the base
        # class whose __init__ a **parallel_options would carry it to.
        check_option_names(cls, options)
        return super().__new__(cls)

    # -- wiring -----------------------------------------------------------------------------

    def configure(
        self,
        *,
        accelerator: Accelerator,
        devices: list[torch.device],
        num_nodes: int,
        precision: Precision,
        checkpoint_io: CheckpointIO | None,
        cluster_environment: ClusterEnvironment,
    ) -> None:
        """Receive what the connector resolved; raise ``ValueError`` on what cannot work.

        Called once, in the calling process, before anything starts. Values the user passed
        to the strategy's constructor win over the connector's. The accelerator, precision and
        checkpoint IO are merged here; where the strategy runs (devices, nodes, environment) is
        merged by :meth:`configure_placement`; then :meth:`complete_configuration` checks the
        result. Override those two hooks rather than this method.
        """
        self._accelerator = self._accelerator or accelerator
        self._precision = self._precision or precision
        self._checkpoint_io = self._checkpoint_io or checkpoint_io
        self.configure_placement(devices=devices, num_nodes=num_nodes, cluster_environment=cluster_environment)
        self.complete_configuration()

    def configure_placement(
        self, *, devices: list[torch.device], num_nodes: int, cluster_environment: ClusterEnvironment
    ) -> None:
        """Take the devices, node count and cluster environment the connector resolved, where the
        constructor gave none; a count this strategy cannot run on is a ``ValueError`` naming it.

        A strategy that decides its placement without them (one that reads its own device) need not
        override this.
        """

    def complete_configuration(self) -> None:
        """Finish and check the strategy's own settings once :meth:`configure` merged the connector's values.

        :attr:`accelerator`, :attr:`precision` and the placement are final here. Raise
        ``ValueError`` on what cannot work (a contradiction names both values); this still
        runs in the calling process, before launch.
        """

    @property
    @abstractmethod
    def launcher(self) -> Launcher:
        """The launcher that starts this strategy's processes."""

    @property
    @abstractmethod
    def root_device(self) -> torch.device:
        """The device this process computes on."""

    @property
    def accelerator(self) -> Accelerator:
        if self._accelerator is None:
            raise RuntimeError(f"{type(self).__name__} has no accelerator yet; create it with stratagem.resolve().")
        return self._accelerator

    @accelerator.setter
    def accelerator(self, accelerator: Accelerator) -> None:
        self._accelerator = accelerator

    @property
    def precision(self) -> Precision:
        if self._precision is None:
            self._precision = Precision()
        return self._precision

    @precision.setter
    def precision(self, precision: Precision) -> None:
        self._precision = precision

    @property
    def checkpoint_io(self) -> CheckpointIO:
        if self._checkpoint_io is None:
            from stratagem.checkpoint_io.torch_io import TorchCheckpointIO

            self._checkpoint_io = TorchCheckpointIO()
        return self._checkpoint_io

    @checkpoint_io.setter
    def checkpoint_io(self, checkpoint_io: CheckpointIO) -> None:
        self._checkpoint_io = checkpoint_io

    def checkpoint_io_problem(self, checkpoint_io: CheckpointIO) -> str | None:
        """Why this strategy cannot save through ``checkpoint_io``, or ``None`` when it can.

        Asked by :func:`stratagem.resolve` about the IO the strategy ended up with, so that an IO
        the strategy would bypass, or would call on other ranks than its
        :attr:`~stratagem.checkpoint_io.CheckpointIO.writes_collectively` declares, is refused
        before anything starts. One process calls either kind.
        """
        return None

    @property
    def checkpoint_written_by_every_rank(self) -> bool:
        """Whether every rank writes its part of each checkpoint (its shards) where the checkpoint is published,
        so that the checkpoint directory must be one filesystem that every node mounts. By default, whether the
        checkpoint IO :attr:`~stratagem.checkpoint_io.CheckpointIO.writes_collectively`."""
        return self.checkpoint_io.writes_collectively

    def estimate_memory(self, footprint: ModelFootprint) -> MemoryEstimate:
        """What one rank would hold at its peak training a model of ``footprint``, as configured.

        Called in the calling process after :meth:`configure`, before anything starts (by ``strategy="auto"``
        and ``stratagem plan``). The default is a replicated strategy's: every rank holds the whole training
        state. A strategy that shards or offloads overrides it.
        """
        return replicated_estimate(footprint)

    def layout_sharding(self, devices_per_node: int) -> LayoutSharding | None:
        """How this strategy, with the options it was created with, would lay a model over a cluster of
        ``devices_per_node`` devices per node; ``None`` (the default) when it does not say, and is then left out of
        ``stratagem plan --world-size``.

        Called on an unconfigured instance in the calling process: a cluster being planned is not this machine.
        """
        return None

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int] | None:
        """``num_replicas``/``rank`` for a DistributedSampler, or ``None`` when data is not split."""
        return None

    @property
    def device_mesh(self) -> DeviceMesh | None:
        """The run's named device mesh (see :mod:`stratagem.mesh`), in the worker once :meth:`setup_environment`
        ran; ``None`` for a strategy that has none. A module reads it as ``self.device_mesh`` in ``configure_model``."""
        return None

    @property
    def data_parallel_group(self) -> Any:
        """The process group of the ranks that see different data, which logged values (``sync_dist``) are reduced
        over; ``None`` when that is every rank. Ranks that split a model (tensor parallelism) share their data."""
        return None

    # -- ranks ------------------------------------------------------------------------------

    @property
    def global_rank(self) -> int:
        return 0

    @property
    def local_rank(self) -> int:
        return 0

    @property
    def node_rank(self) -> int:
        return 0

    @property
    def world_size(self) -> int:
        return 1

    @property
    def is_global_zero(self) -> bool:
        return self.global_rank == 0

    # -- lifecycle (in every worker) --------------------------------------------------------

    def setup_environment(self) -> None:
        """Prepare this process: select the device, join the process group."""
        self._in_run = True
        self.accelerator.setup_device(self.root_device)

    @contextlib.contextmanager
    def module_init_context(self, empty_init: bool | None = None) -> Iterator[None]:
        """Context in which modules are created directly on the target device and dtype.

        ``empty_init=True`` skips parameter initialisation, for weights that will be loaded.
        ``None`` lets the strategy choose how initialised weights are made (a sharded strategy
        may build on the meta device and initialise each rank's shards in :meth:`setup_module`);
        ``False`` asks for ordinary creation.
        """
        with contextlib.ExitStack() as stack:
            if empty_init:
                stack.enter_context(skip_parameter_init())
            stack.enter_context(self.root_device)
            stack.enter_context(self.precision.module_init_context())
            yield

    def model_sharded_context(self) -> contextlib.AbstractContextManager[None]:
        """Lightning's name for :meth:`module_init_context` with the strategy's choice of initialisation."""
        return self.module_init_context()

    def setup_module(self, module: nn.Module) -> nn.Module:
        """Move, cast and wrap the user's module; return the object to run forward on."""
        module = self.precision.convert_module(module).to(self.root_device)
        self._module = self._model = module
        return module

    def setup_optimizers(self, optimizers: list[Optimizer]) -> list[Optimizer]:
        """Adopt the optimizers created for the set-up module; return the ones to step."""
        if self.max_optimizers is not None and len(optimizers) > self.max_optimizers:
            raise ValueError(
                f"{type(self).__name__} supports at most {self.max_optimizers} optimizer(s); "
                f"configure_optimizers returned {len(optimizers)}."
            )
        for optimizer in optimizers:
            self.precision.check_optimizer(optimizer)
        return optimizers

    def compile_blocks(self) -> BlockPolicy | None:
        """Which submodules :meth:`compile_module` compiles one region each when the user names no blocks, or
        ``None`` to compile the module's ``forward`` whole. A strategy that wraps per block (FSDP's wrap policy)
        answers with those blocks."""
        return None

    def compile_module(self, settings: CompileSettings) -> None:
        """Compile the set-up module in place, as ``settings`` say, once the strategy has wrapped it.

        Called in every worker after :meth:`setup_module` (and, in ``fit``, :meth:`setup_optimizers`, where an
        engine may wrap). Parameter names stay as they were, so checkpoints are the uncompiled module's, and the
        wrapper's hooks run around each compiled region. :meth:`teardown` removes the compiled regions again.
        """
        if self._compiled_regions is not None:
            self._compiled_regions.restore()
        self._compiled_regions = CompiledRegions.compile(self.module, settings, self.compile_blocks())

    @property
    def module(self) -> nn.Module:
        """The user's module (unwrapped)."""
        if self._module is None:
            raise RuntimeError("setup_module() has not been called")
        return self._module

    @property
    def model(self) -> nn.Module:
        """The module as wrapped by this strategy (DDP, FSDP, an engine ...)."""
        if self._model is None:
            raise RuntimeError("setup_module() has not been called")
        return self._model

    def run_step(self, step_name: str, *args: Any) -> Any:
        """Call ``module.<step_name>(*args)`` so that the wrapper's forward hooks run around it."""
        with self.precision.forward_context():
            return call_through_forward(self.model, self.module, step_name, *args)

    def backward(self, loss: torch.Tensor, optimizer: Optimizer | None) -> None:
        """Compute gradients of ``loss``."""
        try:
            self.precision.backward(loss, torch.Tensor.backward)
        except RuntimeError as error:
            self.explain_backward_failure(error)
            raise

    def explain_backward_failure(self, error: RuntimeError) -> None:
        """Called with an error out of backward (this one's, or the plain one a loop calls in its place): raise a
        clearer one from it where this strategy can say more (a collective inside backward that failed), or return
        to let it propagate as it is."""

    def optimizer_step(self, optimizer: Optimizer) -> Any:
        """Apply accumulated gradients to the parameters."""
        return self.precision.optimizer_step(optimizer, optimizer.step)

    def zero_grad(self, optimizer: Optimizer) -> None:
        """Forget the gradients of the last step."""
        optimizer.zero_grad(set_to_none=True)

    def clip_gradients(
        self, optimizer: Optimizer, clip_val: float, algorithm: Literal["norm", "value"] = "norm"
    ) -> torch.Tensor | None:
        """Clip gradients of the parameters stepped by ``optimizer``; return the norm when clipping by norm."""
        self.precision.unscale_gradients(optimizer)
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if algorithm == "norm":
            return torch.nn.utils.clip_grad_norm_(params, clip_val)
        torch.nn.utils.clip_grad_value_(params, clip_val)
        return None

    def batch_to_device(self, batch: Any) -> Any:
        """Move a batch to :attr:`root_device` and the precision's input dtype."""
        return self.precision.convert_input(move_to_device(batch, self.root_device))

    # -- collectives ------------------------------------------------------------------------

    @abstractmethod
    def reduce(self, tensor: Any, op: ReduceOp = "mean", *, group: Any = None, reduce_op: Any = None) -> Any:
        """Reduce ``tensor`` over all ranks (or the process ``group``); every rank gets the result.

        Anything that is not a tensor is returned unchanged, as in Lightning. ``reduce_op`` is
        Lightning's name for ``op`` (see :func:`stratagem.strategies.collective_arguments.reduce_operation`).
        """

    @abstractmethod
    def all_gather(self, tensor: torch.Tensor, sync_grads: bool = False, *, group: Any = None) -> torch.Tensor:
        """Stack ``tensor`` from every rank (of ``group``, by default all) along a new first dimension.

        ``sync_grads=True`` makes the result differentiable with respect to every rank's input.
        """

    @abstractmethod
    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Return rank ``src``'s ``obj`` on every rank (tensors stay on their device; other objects are pickled)."""

    @abstractmethod
    def barrier(self, name: str | None = None) -> None:
        """Wait until every rank arrives here. ``name`` appears in a timeout error."""

    def reduce_boolean(self, decision: bool, all_ranks: bool = True) -> bool:
        """Whether ``decision`` holds on all ranks (``all_ranks=True``) or on any rank."""
        flag = torch.tensor(float(decision), device=self.root_device)
        reduced = self.reduce(flag, op="min" if all_ranks else "max")
        return bool(reduced.item() > 0.5)

    def gather_step_outcome(self, outcome: int) -> list[int]:
        """Every rank's ``outcome`` of the training step it just ran (a small int), in rank order.

        Called by the fit loop on every rank after each ``training_step`` and before its backward, so that
        ranks that disagree (one has no loss, or a non-finite one) are found before backward's gradient
        synchronisation waits for a rank that will never join it. One process returns ``[outcome]`` with no
        collective; several exchange it in one :meth:`all_gather` of one int per rank.
        """
        if self.world_size == 1:
            return [outcome]
        flags = torch.tensor([outcome], dtype=torch.int32, device=self.root_device)
        return self.all_gather(flags).flatten().tolist()

    # -- checkpoints ------------------------------------------------------------------------

    def save_checkpoint(self, path: PathLike, state: dict[str, Any]) -> None:
        """Save ``state`` to ``path``. Called on every rank, while the run's processes are joined or after the run.

        ``state`` maps names to plain values or to live objects (``nn.Module``, ``Optimizer``,
        lists of optimizers); the strategy turns live objects into their state in whatever
        form it keeps them (whole, or sharded), and calls its checkpoint IO on the ranks the IO
        declares (:attr:`~stratagem.checkpoint_io.CheckpointIO.writes_collectively`). A checkpoint
        already at ``path`` is replaced whole, and only once the new one is complete (see
        :meth:`CheckpointIO.save_checkpoint`).

        During a run, every rank returns once the checkpoint is complete. After the run (its process
        group gone), a strategy whose processes each hold the whole state writes from global rank 0
        alone while the other ranks return at once; one whose processes each hold their shards joins
        them again to write together (see ``ParallelStrategy._joined_process_group``); one that cannot
        write a complete checkpoint any more (its state went with the run) raises on every rank before
        writing anything.
        """
        checkpoint = {key: self._state_of(value) for key, value in state.items()}
        if self.checkpoint_io.writes_collectively:
            self.checkpoint_io.save_checkpoint(checkpoint, path)
        else:
            write = functools.partial(self.checkpoint_io.save_checkpoint, checkpoint, path)
            self.write_on_rank_zero(write, f"save_checkpoint({str(path)!r})")
        if not self._in_run:
            # Nothing will finish a background write any more (the run's teardown did that for its own):
            # finish this one before returning, raising what it raised.
            self.checkpoint_io.teardown()

    def load_checkpoint(
        self, path: PathLike, state: dict[str, Any], strict: bool = True, weights_only: bool = True
    ) -> dict[str, Any]:
        """Load the checkpoint at ``path`` into the live objects of ``state``, in place.

        Returns the checkpoint's remaining entries (those not in ``state`` as live objects); where
        the reader deferred an entry (a :class:`~stratagem.checkpoint_io.LazyCheckpoint`), it is read
        when the caller takes it, so evaluation never reads the optimizer state it does not use.
        Reads checkpoints written by other strategies and world sizes (see
        :func:`stratagem.checkpoint_io.read_full_checkpoint`).
        """
        from stratagem.checkpoint_io.lazy import LazyCheckpoint
        from stratagem.checkpoint_io.readers import read_full_checkpoint

        checkpoint = read_full_checkpoint(path, self.checkpoint_io, weights_only=weights_only, required=tuple(state))
        remaining = LazyCheckpoint.shallow_copy(checkpoint)
        for key, target in state.items():
            if isinstance(target, nn.Module):
                target.load_state_dict(strip_compile_prefix(remaining.pop(key)), strict=strict)
            elif isinstance(target, Optimizer):
                target.load_state_dict(remaining.pop(key))
            elif is_optimizer_list(target):
                for optimizer, optimizer_state in zip(target, remaining.pop(key), strict=True):
                    optimizer.load_state_dict(optimizer_state)
        return remaining

    def load_pretrained(self, target: nn.Module, weights: SafetensorsWeights) -> None:
        """Copy Hugging Face safetensors ``weights`` into ``target`` (the module set up, or a submodule of it).

        Called on every rank after :meth:`setup_module` and before the optimizers are made, for what
        ``Module.load_pretrained`` asked. Each process reads only the parts of each tensor it holds
        (a strategy that shards reads its shards' slices), so no process ever holds the whole model.
        """
        load_pretrained_weights(target, weights, copy_whole)

    def module_full_state_dict(self) -> dict[str, Any]:
        """The module's whole, unsharded state on CPU, on rank 0 (other ranks may get ``{}``).

        Called on every rank (sharded strategies gather). Used to hand trained weights back
        to a calling process that is not itself a worker, and for single-file checkpoints.
        """
        return {key: value.detach().cpu() for key, value in self.module.state_dict().items()}

    def remove_checkpoint(self, path: PathLike) -> None:
        """Delete a checkpoint this strategy saved. Called on every rank; global rank 0 deletes it."""
        self.write_on_rank_zero(
            functools.partial(self.checkpoint_io.remove_checkpoint, path), f"remove_checkpoint({str(path)!r})"
        )

    def write_on_rank_zero(self, write: Callable[[], None], description: str) -> None:
        """Run ``write`` on global rank 0 only; with several processes, every rank learns how it ended.

        Called on every rank. One process just writes; :class:`ParallelStrategy` shares the outcome.
        """
        if self.is_global_zero:
            write()

    def _state_of(self, value: Any) -> Any:
        if isinstance(value, nn.Module):
            return value.state_dict()
        if isinstance(value, Optimizer):
            return value.state_dict()
        if is_optimizer_list(value):
            return [optimizer.state_dict() for optimizer in value]
        return value

    def teardown(self) -> None:
        """Release everything :meth:`setup_environment` and :meth:`setup_module` acquired."""
        self._in_run = False
        if self._compiled_regions is not None:
            self._compiled_regions.restore()
            self._compiled_regions = None
        self.checkpoint_io.teardown()
        self.precision.teardown()
        if self._accelerator is not None:
            self._accelerator.teardown()

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
