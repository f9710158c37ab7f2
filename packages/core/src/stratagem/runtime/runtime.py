"""Runtime: any registered strategy in the user's own training loop (the Trainer is one client of it)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import torch
from torch import nn
from torch.optim import Optimizer
from torch.utils._pytree import tree_map

from stratagem.checkpoint_io import PathLike
from stratagem.connector import ResolveOptions, resolve, takes_resolve_options
from stratagem.precision import Precision
from stratagem.runtime.checkpoint_state import load_state, saved_state
from stratagem.runtime.lifecycle import StrategyLifecycle
from stratagem.runtime.wrappers import RuntimeDataLoader, RuntimeModule, RuntimeOptimizer, unwrapped, wrap_optimizer
from stratagem.strategies import (
    BackwardSyncControl,
    DefersHostReads,
    EngineSteps,
    FeedsBatchesToDevice,
    LoaderStage,
    LoopSettings,
    OwnsAccumulation,
    OwnsTrainingStep,
    PreparesEachBackward,
    RebuildsDataLoaders,
    ReduceOp,
    StepBoundary,
    StepBoundaryListener,
    StepsLRSchedulers,
    Strategy,
    TakesLoopSettings,
)
from stratagem.strategies.step_calls import StepCalls, batch_to_device_call, step_calls

if TYPE_CHECKING:
    from typing_extensions import Unpack

Result = TypeVar("Result")


class Runtime:
    """A strategy driven by the user's own loop: launch, set up, backward, step, save and load.

    Made with the Trainer's words (``strategy``, ``accelerator``, ``devices``, ``num_nodes``, ``precision``,
    ``plugins``, ``layout``: a mesh layout as ``resolve(layout=...)`` takes it) and resolved by
    :func:`stratagem.resolve` here, before any process starts, so a bad value fails in the calling process.
    ``launch(fn)`` runs ``fn(runtime, *args)`` on every rank; inside it, ``setup`` wraps the module and
    optimizers, ``setup_dataloaders`` splits data over the data-parallel ranks, and ``backward`` replaces
    ``loss.backward()``. Checkpoints are the strategy's, so one saved as ``{"module": model, "optimizers":
    [optimizer]}`` is one the Trainer resumes from, and a Trainer's checkpoint loads here.

    A strategy whose engine runs whole training steps itself (:class:`~stratagem.strategies.OwnsTrainingStep`)
    cannot be driven step by step and is refused here. One whose engine accumulates and steps
    (:class:`~stratagem.strategies.OwnsAccumulation`, DeepSpeed) works through :meth:`backward`, the optimizer's
    ``step`` and :meth:`no_backward_sync`, which tell the engine where an accumulation window ends.
    """

    @takes_resolve_options
    def __init__(self, **options: Unpack[ResolveOptions]) -> None:
        resolved = resolve(**options)
        problem = _own_loop_problem(resolved)
        if problem is not None:
            raise ValueError(f"strategy={options.get('strategy', 'auto')!r} ({type(resolved).__name__}) {problem}")
        self._attach(resolved)

    @classmethod
    def around(cls, strategy: Strategy) -> Runtime:
        """A Runtime driving ``strategy`` as :func:`stratagem.resolve` made it, without resolving it again: how the
        Trainer drives the strategy it resolved. An engine that owns the step is refused by :meth:`setup_module`
        here rather than at construction, since the Trainer runs it through :meth:`step_calls` and the abilities."""
        runtime = cls.__new__(cls)
        runtime._attach(strategy)
        return runtime

    def _attach(self, strategy: Strategy) -> None:
        self.strategy = strategy
        self._lifecycle = StrategyLifecycle(strategy)
        self._model: RuntimeModule | None = None
        self._calls: StepCalls | None = None
        self._skipping_sync = False
        self._loop_settings = LoopSettings()
        # A strategy's capabilities are its class's: decided once here, not on every step.
        self._accumulation_boundary = (
            strategy.set_accumulation_boundary if isinstance(strategy, OwnsAccumulation) else None
        )
        self._step_boundary = strategy.at_step_boundary if isinstance(strategy, StepBoundaryListener) else None

    # -- where this process is --------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        """The device this process computes on."""
        return self.strategy.root_device

    @property
    def global_rank(self) -> int:
        return self.strategy.global_rank

    @property
    def local_rank(self) -> int:
        return self.strategy.local_rank

    @property
    def node_rank(self) -> int:
        return self.strategy.node_rank

    @property
    def world_size(self) -> int:
        return self.strategy.world_size

    @property
    def is_global_zero(self) -> bool:
        return self.strategy.is_global_zero

    # -- starting ---------------------------------------------------------------------------------

    def launch(self, function: Callable[..., Result], *args: Any, **kwargs: Any) -> Result:
        """Run ``function(runtime, *args, **kwargs)`` on every rank, started by the strategy's launcher (the script
        re-run per rank for ``ddp``, spawned or forked processes, or the ranks torchrun/SLURM started), with the
        strategy's environment set up around it and torn down after; return rank 0's result. ``function`` must be
        importable by reference (a module-level function) for launchers that start processes from this one."""
        if not callable(function):
            raise TypeError(f"Runtime.launch() takes the function to run on every rank; got {function!r}.")
        if self._lifecycle.started:
            raise RuntimeError("Runtime.launch() was called inside a launched function; call the function directly.")
        result: Result = self.strategy.launcher.launch(self._run_in_worker, function, args, kwargs)
        return result

    def _run_in_worker(self, function: Callable[..., Result], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Result:
        self._lifecycle.start()
        try:
            return function(self, *args, **kwargs)
        finally:
            self._model, self._skipping_sync = None, False
            self._use_calls(None)
            self._lifecycle.teardown()

    # -- setting up -------------------------------------------------------------------------------

    def init_module(self, empty_init: bool | None = None) -> contextlib.AbstractContextManager[None]:
        """Context to build the module in: on the device and in the precision's dtype, or as the strategy builds
        it (a sharding strategy builds on rank 0 and hands the other ranks their shards of its values).
        ``empty_init=True`` skips initialisation for weights that will be loaded; ``False`` builds as usual."""
        return self._lifecycle.module_init_context(empty_init)

    def setup(self, module: nn.Module, *optimizers: Optimizer) -> Any:
        """:meth:`setup_module` then :meth:`setup_optimizers`; returns the module, or ``(module, *optimizers)``.

        Optimizers made before a strategy replaced the module's parameters (sharding does) are moved onto the
        new ones, by parameter name; make them after :meth:`setup_module` where they hold state already."""
        before = {id(parameter): name for name, parameter in module.named_parameters()}
        model = self.setup_module(module)
        if not optimizers:
            return model
        _rebind(optimizers, before, dict(self.strategy.module.named_parameters()))
        return (model, *self._setup_optimizers(optimizers))

    def setup_module(self, module: nn.Module) -> RuntimeModule:
        """Place, cast and wrap ``module`` (DDP, ``fully_shard``, an engine); return it wrapped so that calling
        it goes through the strategy and the precision."""
        if isinstance(module, RuntimeModule):
            raise TypeError("setup_module() got a module that Runtime set up already; pass the original module.")
        problem = _own_loop_problem(self.strategy)
        if problem is not None:
            raise ValueError(f"setup_module(): {type(self.strategy).__name__} {problem}")
        if not isinstance(module, nn.Module):
            raise TypeError(f"setup_module() takes an nn.Module; got {type(module).__name__}.")
        model = self._lifecycle.setup_module(module)
        self._use_calls(step_calls(self.strategy, "forward", None))
        self._model = RuntimeModule(model, self.strategy.module, self.strategy.precision)
        return self._model

    def _use_calls(self, calls: StepCalls | None) -> None:
        self._calls = calls
        # A strategy with no accumulation or step boundary to tell has nothing to add to its own backward: that
        # is what runtime.backward is then, without a frame of ours per step (tools/bench/own_loop measured the
        # tiny MLP's gap at a few microseconds a piece; this one was within the bench's noise).
        if calls is not None and self._accumulation_boundary is None and self._step_boundary is None:
            self.__dict__["backward"] = calls.backward
        else:
            self.__dict__.pop("backward", None)

    def setup_optimizers(self, *optimizers: Optimizer) -> Any:
        """Hand the optimizers of the set-up module to the strategy; return them wrapped (one, or a tuple), so that
        ``step()`` and ``zero_grad()`` go through the strategy."""
        wrapped = self._setup_optimizers(optimizers)
        return wrapped[0] if len(wrapped) == 1 else tuple(wrapped)

    def _setup_optimizers(self, optimizers: tuple[Optimizer, ...]) -> list[RuntimeOptimizer]:
        for optimizer in optimizers:
            if isinstance(optimizer, RuntimeOptimizer) or not isinstance(optimizer, Optimizer):
                raise TypeError(
                    f"setup_optimizers() takes torch optimizers not yet set up; got {type(optimizer).__name__}."
                )
        adopted = self._lifecycle.setup_optimizers(list(optimizers))
        if self._model is not None and self._model._forward_module is not self.strategy.model:
            # An engine built around the module and its optimizers (DeepSpeed's) runs the forward from now on.
            self._model.wrap_with(self.strategy.model)
        calls = step_calls(self.strategy, "forward", adopted[0] if len(adopted) == 1 else None)
        self._use_calls(calls)
        step = calls.optimizer_step
        at_step_boundary = self._step_boundary
        if at_step_boundary is not None:
            plain_step = step

            def step(optimizer: Optimizer) -> Any:
                result = plain_step(optimizer)
                at_step_boundary("after_optimizer_step")
                return result

        return [wrap_optimizer(optimizer, step, calls.zero_grad) for optimizer in adopted]

    def setup_dataloaders(
        self, *loaders: Iterable[Any], use_distributed_sampler: bool = True, move_to_device: bool = True, seed: int = 0
    ) -> Any:
        """Each loader re-created over this rank's share of the data (a ``DistributedSampler`` over the
        data-parallel ranks, every other setting kept; ``seed`` seeds its shuffle, as ``Trainer(seed=...)``
        does), with batches moved to :attr:`device` and the precision's input dtype; one loader or a tuple.

        The first loader's batch size is what the strategy is told the training batch is (as the Trainer tells
        it): an engine that is built with the optimizers and sized by the batch (DeepSpeed's) needs this call
        before :meth:`setup`, and refuses it after."""
        from stratagem.trainer.data import check_splittable, with_distributed_sampler

        if loaders:
            self._connect_train_batch_size(loaders[0])
        sampler_kwargs = self.strategy.distributed_sampler_kwargs if use_distributed_sampler else None
        prepared = []
        for loader in loaders:
            if not isinstance(loader, Iterable):
                raise TypeError(f"setup_dataloaders() takes dataloaders or iterables; got {type(loader).__name__}.")
            if sampler_kwargs is not None:
                check_splittable(loader, "setup_dataloaders()")
            split = with_distributed_sampler(loader, sampler_kwargs, seed)
            prepared.append(
                RuntimeDataLoader(
                    split,
                    batch_to_device_call(self.strategy) if move_to_device else None,
                    self.batch_feed if move_to_device else None,
                )
            )
        return prepared[0] if len(prepared) == 1 else tuple(prepared)

    def _connect_train_batch_size(self, loader: Iterable[Any]) -> None:
        size = getattr(loader, "batch_size", None)
        settings = self._loop_settings
        if not isinstance(size, int) or settings.train_batch_size is not None:
            return
        if self._lifecycle.optimizers_are_set_up and isinstance(self.strategy, OwnsAccumulation):
            raise RuntimeError(
                f"setup_dataloaders() came after setup_optimizers(), but {type(self.strategy).__name__}'s engine "
                "accumulates and steps itself and was built with the optimizers before it knew the batch size "
                f"({size}), which it is sized by. Call runtime.setup_dataloaders(...) before runtime.setup(...)."
            )
        self.connect_loop_settings(dataclasses.replace(settings, train_batch_size=size))

    # -- a training step --------------------------------------------------------------------------

    def backward(self, loss: torch.Tensor) -> None:
        """Gradients of ``loss``, as the strategy computes them (loss scaling, an engine's backward)."""
        calls = self._calls
        if calls is None:  # checked here rather than in a helper: a frame per step counts on small models
            raise RuntimeError("Runtime.backward() comes after Runtime.setup() (inside Runtime.launch(fn)).")
        if self._accumulation_boundary is not None and not self._skipping_sync:
            self._accumulation_boundary(True)
        calls.backward(loss)
        if self._step_boundary is not None:
            self._step_boundary("after_backward")

    @contextlib.contextmanager
    def no_backward_sync(self, module: nn.Module, enabled: bool = True) -> Iterator[None]:
        """Context for the forward and backward of a micro-batch that is not the last of an accumulation window
        (``enabled``): gradients are not synchronised across ranks until the last one. Where the strategy cannot
        skip the synchronisation it happens every micro-batch (the same result, slower); an engine that
        accumulates itself is told that the window goes on."""
        if not isinstance(module, RuntimeModule):
            raise TypeError("no_backward_sync() takes the module Runtime.setup() returned.")
        strategy = self.strategy
        if isinstance(strategy, OwnsAccumulation):
            strategy.set_accumulation_boundary(not enabled)
        previous, self._skipping_sync = self._skipping_sync, enabled
        try:
            if isinstance(strategy, BackwardSyncControl):
                with strategy.no_backward_sync(enabled):
                    yield
            else:
                yield
        finally:
            self._skipping_sync = previous

    def clip_gradients(
        self, optimizer: Optimizer, *, max_norm: float | None = None, clip_val: float | None = None
    ) -> torch.Tensor | None:
        """Clip the gradients ``optimizer`` steps: by their total norm (``max_norm``, over every rank's shards;
        returns the norm before clipping) or by value (``clip_val``). Give exactly one."""
        if (max_norm is None) == (clip_val is None):
            raise ValueError(f"clip_gradients(max_norm={max_norm!r}, clip_val={clip_val!r}): give exactly one of them.")
        algorithm: Literal["norm", "value"] = "norm" if max_norm is not None else "value"
        value = max_norm if max_norm is not None else clip_val
        assert value is not None
        return self.strategy.clip_gradients(unwrapped(optimizer), value, algorithm)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The precision's forward context, for computations outside the set-up module's forward (a loss)."""
        return self.strategy.precision.forward_context()

    # -- checkpoints ------------------------------------------------------------------------------

    def save(self, path: PathLike, state: dict[str, Any]) -> None:
        """Save ``state`` as the strategy saves (a file, or a directory of shards), on every rank.

        Modules and optimizers (set up or not) are saved as the strategy holds them; objects with
        ``state_dict``/``load_state_dict`` (schedulers, a GradScaler) as their state; other values as they are.
        With ``module``, ``optimizers`` (a list) and ``lr_schedulers`` (a list) as names, the Trainer resumes
        from it."""
        if not isinstance(state, dict):
            raise TypeError(f"save() takes a dict of what to save; got {type(state).__name__}.")
        self.strategy.save_checkpoint(path, saved_state(state))

    def load(
        self, path: PathLike, state: dict[str, Any], strict: bool = True, weights_only: bool = True
    ) -> dict[str, Any]:
        """Load the checkpoint at ``path`` (saved by any strategy, this Runtime's or a Trainer's) into ``state``:
        its modules, optimizers and stateful objects in place, its plain values replaced; return the
        checkpoint's other entries. ``weights_only=False`` allows arbitrary pickled objects (trusted files only)."""
        if not isinstance(state, dict):
            raise TypeError(f"load() takes a dict of what to load into; got {type(state).__name__}.")
        return load_state(self.strategy, path, state, strict=strict, weights_only=weights_only)

    # -- collectives ------------------------------------------------------------------------------

    def all_reduce(self, data: Any, op: ReduceOp = "mean", group: Any = None) -> Any:
        """Every tensor in ``data`` (a tensor or nested lists, tuples and dicts) reduced over the ranks (of
        ``group``, by default all)."""
        if isinstance(data, torch.Tensor):
            return self.strategy.reduce(data, op, group=group)
        return tree_map(lambda value: self.strategy.reduce(value, op, group=group), data)

    def all_gather(self, data: Any, sync_grads: bool = False, group: Any = None) -> Any:
        """Every tensor in ``data`` stacked from every rank along a new first dimension."""
        if isinstance(data, torch.Tensor):
            return self.strategy.all_gather(data, sync_grads, group=group)

        def gather(value: Any) -> Any:
            if not isinstance(value, torch.Tensor):
                return value
            return self.strategy.all_gather(value, sync_grads, group=group)

        return tree_map(gather, data)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s ``obj`` on every rank."""
        return self.strategy.broadcast(obj, src)

    def barrier(self, name: str | None = None) -> None:
        """Wait until every rank arrives here."""
        self.strategy.barrier(name)

    def reduce_boolean(self, decision: bool, all_ranks: bool = True) -> bool:
        """Whether ``decision`` holds on every rank (``all_ranks=True``) or on any rank: one answer for all."""
        return self.strategy.reduce_boolean(decision, all_ranks)

    @property
    def data_parallel_group(self) -> Any:
        """The process group of the ranks that see different data (``None``: every rank); what a value computed
        from each rank's batch is reduced over."""
        return self.strategy.data_parallel_group

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on global rank 0 only."""
        if self.is_global_zero:
            print(*args, **kwargs)

    # -- for a driver that owns the loop's shape (the Trainer) -------------------------------------
    # What the methods above do for one step, handed out once per loop in the form the loop calls per batch,
    # and the abilities a loop must know to order its calls. A driver calls the strategy through nothing else.

    @property
    def lifecycle(self) -> StrategyLifecycle:
        """The run's setup and teardown, in the one order both drivers follow."""
        return self._lifecycle

    @property
    def precision(self) -> Precision:
        return self.strategy.precision

    @property
    def loop_settings(self) -> LoopSettings:
        """How the loop steps, as last told by :meth:`connect_loop_settings` (the defaults before)."""
        return self._loop_settings

    def connect_loop_settings(self, settings: LoopSettings) -> None:
        """Say how the loop steps (accumulation, clipping, the training batch size); told to a strategy that
        :class:`~stratagem.strategies.TakesLoopSettings`, which may raise ``ValueError`` on a contradiction."""
        if isinstance(self.strategy, TakesLoopSettings):
            self.strategy.connect_loop_settings(settings)
        self._loop_settings = settings

    def step_calls(self, step_name: str, backward_optimizer: Optimizer | None = None) -> StepCalls:
        """The per-batch calls of a loop that runs ``module.<step_name>`` through the set-up module, backward (with
        ``backward_optimizer``, the one optimizer when there is one) and the optimizer steps."""
        return step_calls(self.strategy, step_name, backward_optimizer)

    def clip_gradients_as(
        self, optimizer: Optimizer, clip_val: float, algorithm: Literal["norm", "value"]
    ) -> torch.Tensor | None:
        """:meth:`clip_gradients` with the algorithm named as ``Trainer(gradient_clip_algorithm=...)`` names it."""
        return self.strategy.clip_gradients(optimizer, clip_val, algorithm)

    @property
    def step_boundary(self) -> Callable[[StepBoundary], None] | None:
        """What to call at each step boundary (a :class:`~stratagem.strategies.StepBoundaryListener`'s), or
        ``None``: the loop then skips the call."""
        return self._step_boundary

    @property
    def batch_feed(self) -> Callable[[Iterator[Any]], Iterator[Any]]:
        """How a pass's batches are read: through the strategy's own device loader
        (:class:`~stratagem.strategies.FeedsBatchesToDevice`), else as the loader yields them."""
        strategy = self.strategy
        return strategy.device_batches if isinstance(strategy, FeedsBatchesToDevice) else _as_yielded

    def rebuild_dataloaders(self, loaders: list[Iterable[Any]], stage: LoaderStage) -> list[Iterable[Any]]:
        """The loaders of a pass as the strategy's engine reads them (:class:`~stratagem.strategies.
        RebuildsDataLoaders`), else unchanged."""
        strategy = self.strategy
        if not isinstance(strategy, RebuildsDataLoaders):
            return loaders
        return [strategy.rebuild_dataloader(loader, stage) for loader in loaders]

    @property
    def gradient_sync_skipper(self) -> Callable[[bool], contextlib.AbstractContextManager[Any]] | None:
        """The strategy's ``no_backward_sync(enabled)`` where it can skip gradient sync
        (:class:`~stratagem.strategies.BackwardSyncControl`), else ``None``."""
        strategy = self.strategy
        return strategy.no_backward_sync if isinstance(strategy, BackwardSyncControl) else None

    @property
    def accumulation_boundary(self) -> Callable[[bool], None] | None:
        """The engine's ``set_accumulation_boundary`` where it accumulates itself
        (:class:`~stratagem.strategies.OwnsAccumulation`), else ``None``."""
        return self._accumulation_boundary

    @property
    def engine_training_steps(self) -> tuple[Callable[[Any, int], EngineSteps], int] | None:
        """``(run_training_steps, optimizer_steps_per_call)`` of an engine that runs whole training steps
        (:class:`~stratagem.strategies.OwnsTrainingStep`), else ``None``."""
        strategy = self.strategy
        if not isinstance(strategy, OwnsTrainingStep):
            return None
        return strategy.run_training_steps, strategy.optimizer_steps_per_call

    @property
    def backward_preparation(self) -> Callable[[Any], None] | None:
        """What to call before a backward run inside the module's forward (manual optimization):
        a :class:`~stratagem.strategies.PreparesEachBackward`'s ``prepare_backward``, else ``None``."""
        strategy = self.strategy
        return strategy.prepare_backward if isinstance(strategy, PreparesEachBackward) else None

    @property
    def reads_steps_on_host(self) -> bool:
        """Whether a loop may read each step's loss on the host (not for a
        :class:`~stratagem.strategies.DefersHostReads` strategy)."""
        return not isinstance(self.strategy, DefersHostReads)

    @property
    def steps_lr_schedulers(self) -> bool:
        """Whether the strategy steps the learning-rate schedulers it was given
        (:class:`~stratagem.strategies.StepsLRSchedulers`): a loop then steps none."""
        return isinstance(self.strategy, StepsLRSchedulers)

    def gather_step_outcome(self, outcome: int) -> list[int]:
        """Every rank's ``outcome`` of the step it just ran (see ``Strategy.gather_step_outcome``)."""
        return self.strategy.gather_step_outcome(outcome)

    def reset_peak_memory(self) -> None:
        """Start counting this device's peak memory from now."""
        self.strategy.accelerator.reset_peak_memory(self.strategy.root_device)

    def peak_memory_bytes(self) -> int | None:
        """This device's peak memory since :meth:`reset_peak_memory`, or ``None`` where the accelerator cannot say."""
        return self.strategy.accelerator.peak_memory_bytes(self.strategy.root_device)

    def module_full_state_dict(self) -> dict[str, Any]:
        """The set-up module's whole state on CPU on rank 0 (see ``Strategy.module_full_state_dict``)."""
        return self.strategy.module_full_state_dict()

    def __repr__(self) -> str:
        return f"Runtime({self.strategy!r})"


def _own_loop_problem(strategy: Strategy) -> str | None:
    """Why ``strategy`` cannot be driven step by step by a user's loop, or ``None`` when it can."""
    if isinstance(strategy, OwnsTrainingStep):
        reason = (
            "runs whole training steps (forward, backward, optimizer step and accumulation in one call), so there "
            "is no backward or step for a loop to call"
        )
    elif isinstance(strategy, RebuildsDataLoaders):
        reason = "reads the data in a form of its own, which only the Trainer builds"
    else:
        return None
    return f"cannot run in an own loop: its engine {reason}. Train it with stratagem.Trainer."


def _as_yielded(batches: Iterator[Any]) -> Iterator[Any]:
    return batches


def _rebind(optimizers: tuple[Optimizer, ...], names: dict[int, str], parameters: dict[str, nn.Parameter]) -> None:
    """Point the optimizers' parameter groups at the set-up module's parameters, by name."""
    for optimizer in optimizers:
        if not isinstance(optimizer, Optimizer):
            continue
        for group in optimizer.param_groups:
            replaced = [parameters.get(names.get(id(parameter), ""), parameter) for parameter in group["params"]]
            if any(new is not old for new, old in zip(replaced, group["params"])) and optimizer.state:
                raise ValueError(
                    f"{type(optimizer).__name__} holds state for parameters the strategy replaced when it set up "
                    "the module; make the optimizer after Runtime.setup_module()."
                )
            group["params"] = replaced
