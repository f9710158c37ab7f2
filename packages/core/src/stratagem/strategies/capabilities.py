"""Optional abilities of a strategy, each a small interface a strategy opts into by subclassing it.

The drivers (:class:`stratagem.Runtime`, and the Trainer through it) ask ``isinstance(strategy, <ability>)``
once, when a run or a pass starts, and pick the code path that fits (see :mod:`stratagem.trainer.accumulation`
and ``Runtime.batch_feed``); a strategy that lacks an ability is never called for it. Unless an interface says
otherwise, its methods run in every worker, during a run, with the process group live.

The last group here is what only the Trainer asks about (its loop settings, ``check_run``, the schedulers
``configure_optimizers`` returns, ...): a strategy that declares none of them works in both drivers with the
defaults each interface names.
"""

from __future__ import annotations

import contextlib
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

if TYPE_CHECKING:
    from stratagem.mesh import MeshLayout


class BackwardSyncControl(ABC):
    """A strategy whose backward synchronises gradients across ranks, and that can skip it.

    With ``accumulate_grad_batches > 1`` the Trainer accumulates: it divides each micro-batch's loss
    by the number of micro-batches, runs :meth:`no_backward_sync` around the forward and backward of
    every micro-batch, and steps the optimizers on the last one. Without this ability gradients are
    synchronised on every micro-batch (correct, only slower).
    """

    @abstractmethod
    def no_backward_sync(self, enabled: bool) -> contextlib.AbstractContextManager[Any]:
        """Context for one micro-batch's forward and backward: skips gradient synchronisation when
        ``enabled`` (not the last micro-batch of a window), synchronises as usual otherwise."""


class OwnsAccumulation(ABC):
    """A strategy whose engine accumulates gradients and decides when the optimizer really steps.

    The Trainer then leaves the loss unscaled, and on every micro-batch calls
    :meth:`set_accumulation_boundary`, then ``backward`` and ``optimizer_step`` (the engine steps,
    clips and zeroes only on the boundary); on the boundary it also calls ``clip_gradients`` and
    ``zero_grad`` and counts one optimizer step.
    """

    @abstractmethod
    def set_accumulation_boundary(self, is_boundary: bool) -> None:
        """Told before each training micro-batch's forward: whether the step after it ends an
        accumulation window. Windows are cut short at the end of an epoch, which an engine counting
        micro-batches itself cannot know."""


class PreparesEachBackward(ABC):
    """A strategy whose wrapper synchronises gradients in a backward only when told, before it, what that
    backward computes (DDP's reducer, prepared at the end of the wrapper's forward).

    Under manual optimization (``automatic_optimization = False``) ``training_step`` runs its backwards
    itself, inside the wrapper's forward and possibly several per step, so the preparation at the end of
    forward comes too late: the Trainer then calls :meth:`prepare_backward` before every
    ``manual_backward``. Without this ability nothing is called.
    """

    @abstractmethod
    def prepare_backward(self, loss: Any) -> None:
        """Told just before backward runs on ``loss`` from inside ``training_step``."""


StepBoundary = Literal["after_backward", "after_optimizer_step", "before_evaluation_step"]
"""Where in a run :meth:`StepBoundaryListener.at_step_boundary` is called."""


class StepBoundaryListener(ABC):
    """A strategy that must act where one step's work ends and the next begins.

    For devices that record operations lazily and run them as one graph when told (Habana's
    ``mark_step``, an XLA graph cut), the Trainer tells the strategy at each boundary:

    - ``"after_backward"``: after every training micro-batch's backward (the strategy's ``backward``
      returned);
    - ``"after_optimizer_step"``: after each optimizer's step (``optimizer_step`` returned), on the steps
      the Trainer counts;
    - ``"before_evaluation_step"``: before every ``validation_step``, ``test_step`` and ``predict_step``.

    Nothing else calls it: logging a metric, ``reduce`` or a checkpoint is no boundary. The Trainer
    picks the callable once per loop (:func:`stratagem.trainer.step_boundaries.step_boundary_callback`);
    without this ability nothing is called.
    """

    @abstractmethod
    def at_step_boundary(self, boundary: StepBoundary) -> None:
        """Told that the run reached ``boundary`` (see the class for where each one is)."""


class FeedsBatchesToDevice(ABC):
    """A strategy whose batches reach its device through a loader of its own.

    XLA's parallel loader is one: it copies batches to the device ahead of the loop in a background
    thread and cuts the lazily traced graph at every batch, so that each step compiles once and runs as
    one graph. The loops then read every pass (a training epoch, each evaluation or prediction
    dataloader) through :meth:`device_batches`; ``batch_to_device`` still runs on what it yields.
    """

    @abstractmethod
    def device_batches(self, batches: Iterator[Any]) -> Iterator[Any]:
        """The batches of one pass in the order ``batches`` yields them, already on the device. ``batches``
        is the pass's iterator as the loop would read it (limited, and positioned where a resumed epoch
        starts); what is not read when the loop stops early is dropped with the returned iterator."""


@dataclass(frozen=True)
class EngineSteps:
    """What one call of an engine that owns the training step did."""

    output: Any
    """What the Trainer treats as ``training_step``'s output: the loss (a scalar tensor) or a dict with a
    ``'loss'`` tensor, reduced over the call's micro-batches; the progress bar and callbacks see it."""
    optimizer_steps: int
    """How many optimizer steps the call made (each one counts towards ``global_step``)."""


class OwnsTrainingStep(ABC):
    """A strategy whose engine runs whole training steps: forward, backward, optimizer step and
    gradient accumulation, over several micro-batches per call (a compiled executable, for instance).

    The Trainer then never calls ``backward``, ``optimizer_step``, ``zero_grad`` or ``clip_gradients``:
    each item of the training data (see :class:`RebuildsDataLoaders`, which such an engine usually
    needs too) goes to :meth:`run_training_steps`, and ``global_step`` advances by the steps it reports.
    ``accumulate_grad_batches`` reaches the engine through ``connect_loop_settings``. Learning-rate
    schedulers step on the host between calls; the strategy hands the changed optimizer to its engine
    before the next call.
    """

    @property
    @abstractmethod
    def optimizer_steps_per_call(self) -> int:
        """How many optimizer steps one full call makes (for the step estimate schedulers read)."""

    @abstractmethod
    def run_training_steps(self, batch: Any, batch_idx: int) -> EngineSteps:
        """Run the engine on one item of the training data (already through ``batch_to_device``)."""


LoaderStage = Literal["fit", "validate", "test", "predict"]


class ChecksModuleBeforeLaunch(ABC):
    """A strategy whose settings must fit the module's structure (a pipeline's split points, its blocks).

    The Trainer calls :meth:`check_module` in the calling process when ``fit``/``validate``/``test``/``predict``
    starts, after ``check_run`` and before any process starts, so that a setting the module cannot honour fails
    there, naming it.
    """

    @abstractmethod
    def check_module(self, module: Any, stage: LoaderStage) -> None:
        """Raise ``ValueError``/``TypeError`` naming what in the strategy's settings ``module`` cannot honour for a
        ``stage`` run. ``module`` is as the user passed it: what ``configure_model`` builds is not there yet, and
        the strategy checks that part again in its ``setup_module``."""


class RebuildsDataLoaders(ABC):
    """A strategy whose engine consumes data in its own form (several micro-batches combined per call,
    a device-side prefetcher): the Trainer hands it every dataloader of a pass, once, before the pass."""

    @abstractmethod
    def rebuild_dataloader(self, loader: Iterable[Any], stage: LoaderStage) -> Iterable[Any]:
        """The loader the pass reads instead of ``loader`` (the user's, already split across ranks where
        the strategy splits data). ``stage`` is ``"fit"`` for the training data, else the pass's stage
        (validation during fit is ``"validate"``). Raise ``ValueError`` naming the setting that cannot work."""


class RehearsesSetup(ABC):
    """A strategy that can apply its setup to a module built on the meta device, in one process on torch's fake
    process group: what ``stratagem plan --dry-run`` does to show each rank's real shards before any job starts.

    Unlike the abilities above, this runs in the calling process, outside any run: the process group is fake
    (collectives do nothing) and nothing is allocated.
    """

    @abstractmethod
    def rehearse_setup(self, module: Any, device_mesh: Any) -> Any:
        """Wrap and shard ``module`` (an ``nn.Module`` on the meta device, already split by its own tensor-parallel
        plan) over ``device_mesh`` (named ``dp_replicate``, ``dp_shard``, ``tp``, ... as :mod:`stratagem.mesh`
        builds it) as :meth:`Strategy.setup_module` would, without allocating or moving any tensor; return the
        module the run would train."""


class TakesMeshLayout(ABC):
    """A strategy that runs a :class:`~stratagem.mesh.MeshLayout` given as ``resolve(layout=...)`` (and
    ``Trainer(layout=...)``).

    Unlike the abilities above, this one is used in the calling process: ``resolve`` hands the layout to
    :meth:`use_layout` before the strategy is configured, and refuses, naming the sizes, a layout given to a
    strategy without this ability, or one that makes a dimension outside :attr:`mesh_dimensions` larger than 1.
    """

    mesh_dimensions: ClassVar[frozenset[str]]
    """The layout's dimensions this strategy can spread over more than one rank."""

    @abstractmethod
    def use_layout(self, layout: MeshLayout) -> None:
        """Run ``layout`` (not yet resolved against the world size: ``-1`` takes the ranks that are left).
        Raises ``ValueError`` when it conflicts with a layout the strategy was constructed with."""


# -- what only the Trainer asks about ------------------------------------------------------------------


@dataclass(frozen=True)
class LoopSettings:
    """What the training loop was asked to do, for strategies that must know it up front
    (:class:`TakesLoopSettings`)."""

    accumulate_grad_batches: int = 1
    gradient_clip_val: float | None = None
    gradient_clip_algorithm: Literal["norm", "value"] = "norm"
    train_batch_size: int | None = None
    """The training dataloader's batch size per process, once a run knows it (``None`` before, or when the
    loader has none, e.g. an iterable of ready-made batches)."""
    manual_optimization: bool = False
    """Whether the fitted module runs its own backwards and optimizer steps inside ``training_step``
    (``automatic_optimization = False``), known once ``fit`` is given the module."""


class TakesLoopSettings:
    """A strategy that must know how the loop steps before it runs (an engine configured with the accumulation,
    the clipping or the batch size; an option that cannot accumulate).

    The Trainer calls :meth:`connect_loop_settings` at construction and again when a run learns its training batch
    size or that the module optimizes manually (before any process starts where it can); ``Runtime`` calls it from
    ``setup_dataloaders`` with the first loader's batch size. Without this ability a strategy is never told, and
    reads nothing of the loop. :attr:`loop_settings` is the last value told (the defaults before).
    """

    loop_settings: LoopSettings = LoopSettings()

    def connect_loop_settings(self, settings: LoopSettings) -> None:
        """Receive the loop settings; raise ``ValueError`` on a contradiction with the strategy's options. An
        override calls ``super().connect_loop_settings(settings)``, which keeps them as :attr:`loop_settings`."""
        self.loop_settings = settings


class ChecksRunBeforeLaunch(ABC):
    """A strategy that can do only some of ``fit``/``validate``/``test``/``predict`` (an inference-only option).

    The Trainer calls :meth:`check_run` in the calling process as each of them starts, before any process starts.
    """

    @abstractmethod
    def check_run(self, stage: LoaderStage) -> None:
        """Raise ``ValueError`` naming the option for a ``stage`` run this strategy cannot do."""


class TakesLRSchedulers:
    """A strategy that must see the learning-rate schedulers ``configure_optimizers`` returned: it allows only
    :attr:`max_lr_schedulers` of them, or hands them to its engine, or refuses some kinds.

    Called after ``setup_optimizers`` in ``fit`` (an own loop makes its schedulers itself and is never asked).
    Without this ability any number of schedulers is accepted and the Trainer steps them.
    """

    max_lr_schedulers: ClassVar[int | None] = None
    """How many learning-rate schedulers :meth:`check_lr_schedulers` accepts; ``None`` means no limit."""

    def check_lr_schedulers(self, schedulers: list[Any]) -> None:
        """Refuse (``ValueError``) or adopt ``schedulers``; an override calls ``super()``, which checks
        :attr:`max_lr_schedulers`."""
        if self.max_lr_schedulers is not None and len(schedulers) > self.max_lr_schedulers:
            raise ValueError(
                f"{type(self).__name__} supports at most {self.max_lr_schedulers} learning-rate scheduler(s); "
                f"configure_optimizers returned {len(schedulers)}."
            )


class StepsLRSchedulers(TakesLRSchedulers):
    """A strategy that steps the schedulers :meth:`~TakesLRSchedulers.check_lr_schedulers` hands it on a clock of
    its own (a swarm's collaborative epoch, which no ``interval`` of the Trainer's can express). The Trainer then
    never steps them, and still saves and restores their state in checkpoints."""


class SuppliesOptimizer(ABC):
    """A strategy that may create the optimizer itself from a backend's config, so that ``configure_optimizers``
    may be absent or return nothing. Without this ability ``fit`` needs ``configure_optimizers``."""

    @property
    @abstractmethod
    def supplies_optimizer(self) -> bool:
        """True when ``setup_optimizers`` creates the optimizer itself when given none, as configured."""


class RefusesManualOptimization(ABC):
    """A strategy that cannot run a module with ``automatic_optimization = False`` (``training_step`` calling
    ``manual_backward`` and stepping its optimizers). Refused by the Trainer before any process starts, naming
    :attr:`manual_optimization_unsupported`. Engines that own backward and the optimizer step
    (:class:`OwnsAccumulation`, :class:`OwnsTrainingStep`) are refused for that already."""

    manual_optimization_unsupported: ClassVar[str]
    """Why: a clause that follows "which <Strategy> cannot run: "."""


class DefersHostReads(ABC):  # noqa: B024 - declared, nothing to implement
    """A strategy whose device runs lazily, where reading a value on the host costs what the lazy execution exists
    to avoid (XLA: a device round trip and a cut graph).

    The fit loop then reads no training step's loss on the host: it checks neither that the loss is finite nor
    that every rank has one (``Trainer(nonfinite=...)`` is not applied to the loss). Without this ability the loop
    reads each step's loss once (see ``Strategy.gather_step_outcome``).
    """


def adopt_legacy_capabilities(cls: type) -> None:
    """Give a strategy class written against an older stratagem the abilities its members declare.

    0.1 declared accumulation by the class attribute ``handles_gradient_accumulation = True`` plus a
    ``set_accumulation_boundary`` override, and gradient-sync control by overriding
    ``no_backward_sync``; later ones declared ``check_run``, ``supplies_optimizer``,
    ``manual_optimization_unsupported`` and ``checks_steps_on_host`` on Strategy itself. Such a class is
    registered as the interface it means with a ``DeprecationWarning`` saying what to subclass instead; a class
    that sets the flag without the method it needs, or overrides a member that now lives in a mixin it would call
    ``super()`` through, is refused with a ``TypeError``.
    """
    if cls.__dict__.get("handles_gradient_accumulation") is True and not issubclass(cls, OwnsAccumulation):
        if not callable(getattr(cls, "set_accumulation_boundary", None)):
            raise TypeError(
                f"{cls.__qualname__} sets handles_gradient_accumulation = True but defines no "
                "set_accumulation_boundary(is_boundary). The flag is gone: subclass "
                "stratagem.strategies.OwnsAccumulation and implement set_accumulation_boundary, which the "
                "Trainer calls before every micro-batch."
            )
        OwnsAccumulation.register(cls)
        _warn_legacy(cls, "handles_gradient_accumulation = True", "OwnsAccumulation")
    if "no_backward_sync" in cls.__dict__ and not issubclass(cls, BackwardSyncControl):
        BackwardSyncControl.register(cls)
        _warn_legacy(cls, "a no_backward_sync override", "BackwardSyncControl")
    if "check_run" in cls.__dict__ and not issubclass(cls, ChecksRunBeforeLaunch):
        ChecksRunBeforeLaunch.register(cls)
        _warn_legacy(cls, "a check_run override", "ChecksRunBeforeLaunch")
    if isinstance(cls.__dict__.get("supplies_optimizer"), property) and not issubclass(cls, SuppliesOptimizer):
        SuppliesOptimizer.register(cls)
        _warn_legacy(cls, "a supplies_optimizer property", "SuppliesOptimizer")
    if isinstance(cls.__dict__.get("manual_optimization_unsupported"), str) and not issubclass(
        cls, RefusesManualOptimization
    ):
        RefusesManualOptimization.register(cls)
        _warn_legacy(cls, "manual_optimization_unsupported", "RefusesManualOptimization")
    if cls.__dict__.get("checks_steps_on_host") is False and not issubclass(cls, DefersHostReads):
        DefersHostReads.register(cls)
        _warn_legacy(cls, "checks_steps_on_host = False", "DefersHostReads")
    for member, mixin in _MOVED_TO_MIXINS.items():
        if member in cls.__dict__ and not issubclass(cls, mixin):
            raise TypeError(
                f"{cls.__qualname__} defines {member}, which Strategy no longer has: it belongs to "
                f"stratagem.strategies.{mixin.__name__} now. Subclass it beside Strategy (see "
                "docs/writing-a-strategy.md)."
            )


_MOVED_TO_MIXINS: dict[str, type] = {
    "connect_loop_settings": TakesLoopSettings,
    "check_lr_schedulers": TakesLRSchedulers,
    "max_lr_schedulers": TakesLRSchedulers,
    "steps_lr_schedulers": StepsLRSchedulers,
}
"""Members that moved from Strategy to an interface a strategy must call ``super()`` through."""


def _warn_legacy(cls: type, declared: str, ability: str) -> None:
    warnings.warn(
        f"{cls.__qualname__} declares {declared}, stratagem 0.1's way; it is treated as "
        f"stratagem.strategies.{ability}. Subclass {ability} instead (see docs/writing-a-strategy.md).",
        DeprecationWarning,
        stacklevel=5,
    )
