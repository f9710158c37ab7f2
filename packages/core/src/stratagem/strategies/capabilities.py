"""Optional abilities of a strategy, each a small interface a strategy opts into by subclassing it.

The Trainer asks ``isinstance(strategy, <ability>)`` once, when a run or a pass starts, and picks the
code path that fits (see :mod:`stratagem.trainer.accumulation` and ``stratagem.trainer.data.batch_feed``);
a strategy that lacks an ability is never called for it. All methods here run in every worker, during a
run, with the process group live.
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


def adopt_legacy_capabilities(cls: type) -> None:
    """Give a strategy class written against stratagem 0.1 the abilities its members declare.

    0.1 declared accumulation by the class attribute ``handles_gradient_accumulation = True`` plus a
    ``set_accumulation_boundary`` override, and gradient-sync control by overriding
    ``no_backward_sync``. Such a class is registered as :class:`OwnsAccumulation` or
    :class:`BackwardSyncControl` with a ``DeprecationWarning`` saying what to subclass instead; a class
    that sets the flag without the method it needs is refused with a ``TypeError``.
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


def _warn_legacy(cls: type, declared: str, ability: str) -> None:
    warnings.warn(
        f"{cls.__qualname__} declares {declared}, stratagem 0.1's way; it is treated as "
        f"stratagem.strategies.{ability}. Subclass {ability} instead (see docs/writing-a-strategy.md).",
        DeprecationWarning,
        stacklevel=5,
    )
