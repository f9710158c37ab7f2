"""The Module: an ``nn.Module`` that says how it is trained, validated, tested and used for prediction."""

from __future__ import annotations

import contextlib
import inspect
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import torch
from torch import nn

from stratagem.module_loading import HyperParameters, init_arguments, load_module

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from stratagem.trainer.metrics import ReduceFx
    from stratagem.trainer.run_context import RunContext
    from stratagem.trainer.trainer import Trainer

ModuleT = TypeVar("ModuleT", bound="Module")


class Module(nn.Module):
    """Subclass this, define ``training_step`` and ``configure_optimizers``, and hand it to a Trainer.

    Every hook has a default that does nothing, so a subclass defines only what it needs.
    Inside hooks, :attr:`trainer`, :attr:`device` and :attr:`global_rank` describe the run.
    """

    automatic_optimization: bool = True
    """Whether the Trainer runs backward and the optimizer steps on the loss ``training_step`` returns. Set it to
    ``False`` (in ``__init__``) to do that in ``training_step``: :meth:`manual_backward`, then ``step()`` and
    ``zero_grad()`` on what :meth:`optimizers` returns. Each such step counts towards ``global_step``, and the
    Trainer steps no learning-rate scheduler (call ``step()`` on what :meth:`lr_schedulers` returns)."""

    def __init__(self) -> None:
        super().__init__()
        self._trainer: Trainer | None = None
        self._run_context: RunContext | None = None
        self._hparams = HyperParameters()

    # -- the run this module is part of -----------------------------------------------------

    @property
    def trainer(self) -> Trainer:
        """The Trainer running this module; raises when it is not part of a run."""
        if self._trainer is None:
            raise RuntimeError(f"{type(self).__name__} is not attached to a Trainer; pass it to Trainer.fit() first.")
        return self._trainer

    @trainer.setter
    def trainer(self, trainer: Trainer | None) -> None:
        self._trainer = trainer
        self._run_context = None

    def _attach_run(self, trainer: Trainer, context: RunContext) -> None:
        """Called by the Trainer when this module joins a run: :meth:`log` records into ``context``."""
        self._trainer = trainer
        self._run_context = context

    @property
    def device(self) -> torch.device:
        """The device this process computes on (where the parameters are, outside a run)."""
        if self._trainer is not None:
            return self._trainer.strategy.root_device
        for tensor in self.parameters():
            return tensor.device
        return torch.device("cpu")

    @property
    def global_rank(self) -> int:
        """Rank of this process among all processes of the run (0 outside a run)."""
        return self._trainer.global_rank if self._trainer is not None else 0

    @property
    def device_mesh(self) -> DeviceMesh | None:
        """The run's named device mesh, for splitting layers in :meth:`configure_model`
        (``parallelize_module(self.model, self.device_mesh["tp"], plan)``); ``None`` outside a run or when the
        strategy has none (see :attr:`stratagem.strategies.Strategy.device_mesh`)."""
        return self._trainer.strategy.device_mesh if self._trainer is not None else None

    def __getstate__(self) -> dict[str, Any]:
        # The Trainer re-attaches itself in every worker; pickling it along with the module
        # (torch.save(module), deepcopy) would drag the whole run with it.
        state = self.__dict__.copy()
        state["_trainer"] = None
        state["_run_context"] = None
        return state

    # -- hyperparameters and checkpoints -----------------------------------------------------

    @property
    def hparams(self) -> HyperParameters:
        """What :meth:`save_hyperparameters` saved (a dict that also reads as attributes: ``self.hparams.lr``)."""
        return self._hparams

    def save_hyperparameters(self, *names: str, ignore: str | Iterable[str] | None = None) -> None:
        """Record the arguments ``__init__`` received (call it there) in :attr:`hparams`; checkpoints
        the Trainer writes store them, so that :meth:`load_from_checkpoint` can rebuild the module.

        ``names`` keeps only those arguments; ``ignore`` leaves some out (e.g. a module passed in).
        Values are kept as a weights-only load reads them back: a path becomes a string, a numpy
        scalar a Python number; None, bool, int, float, complex, str, bytes, tensors, dtypes,
        devices and lists, tuples, sets and dicts of them are kept as they are. Anything else (an
        enum, a dataclass, a module, any other object) is a ``TypeError`` naming the argument.
        """
        frame = inspect.currentframe()
        caller = frame.f_back if frame is not None else None
        if caller is None:
            raise RuntimeError("save_hyperparameters() could not see the __init__ that called it.")
        self._hparams.update(init_arguments(caller, names, ignore))

    @classmethod
    def load_from_checkpoint(
        cls: type[ModuleT],
        checkpoint_path: str | Path,
        map_location: Any = None,
        strict: bool = True,
        weights_only: bool = True,
        **kwargs: Any,
    ) -> ModuleT:
        """A new module built with the checkpoint's saved hyperparameters (``kwargs`` override them),
        its layers created (:meth:`configure_model`) and its weights loaded, in eval mode.

        Reads a checkpoint of any strategy (a file, or a directory of shards when the package that
        wrote it is installed), weights-only unless ``weights_only=False``. ``map_location``: a
        device to move the module to.
        """
        return load_module(cls, checkpoint_path, map_location, strict, weights_only, kwargs)

    # -- creating the model and its optimizers ------------------------------------------------

    def configure_model(self) -> None:
        """Create layers here instead of in ``__init__`` to have them built directly on the device,
        in the precision's dtype, or sharded (strategies that shard build them in place).

        Called in every worker before the strategy wraps the module, possibly more than once
        in a process (fit, then test): create layers only if they do not exist yet.
        """

    def load_pretrained(self, directory: str | Path, into: nn.Module | None = None) -> None:
        """Load Hugging Face safetensors weights (a directory ``from_pretrained`` reads) into ``into`` (default:
        this module), whose state-dict names are those of the files, once the strategy has set the module up.

        Call it where the model is built (``configure_model``, or ``__init__``): under a strategy that
        builds on the meta device (``fsdp``) or partitioned (``deepspeed_stage_3``) each process reads
        only the parts of each tensor it holds, so the whole model is never in one process; elsewhere it
        is a plain load. Every weight of ``into`` must be in the files (tied weights once), at its shape.
        A checkpoint the run resumes from (``ckpt_path``) is loaded after, and wins.
        """
        from stratagem.checkpoint_io.safetensors_import import PretrainedRequest, SafetensorsWeights

        SafetensorsWeights(directory).close()  # a wrong directory is named here, not after the model is set up
        requests = self.__dict__.setdefault("_pretrained_requests", [])
        requests.append(PretrainedRequest(Path(directory), self if into is None else into))

    def configure_optimizers(self) -> Any:
        """Return the optimizer(s) and learning-rate scheduler(s) for :meth:`Trainer.fit`.

        Accepted forms: an optimizer; a list or tuple of optimizers; two lists
        ``([optimizers], [schedulers])``; a dict ``{"optimizer": ..., "lr_scheduler": ...}``
        (or a list of such dicts), where the scheduler is a scheduler or a dict with
        ``"scheduler"``, ``"interval"`` (``"step"`` or ``"epoch"``), ``"frequency"``,
        ``"monitor"`` (a logged metric, for ``ReduceLROnPlateau``) and ``"strict"``.
        Called after the strategy set up the module, so sharded parameters are what the
        optimizers see.
        """
        raise NotImplementedError(
            f"{type(self).__name__}.configure_optimizers() is not defined; Trainer.fit() needs it to return an "
            "optimizer, e.g. torch.optim.AdamW(self.parameters(), lr=1e-3)."
        )

    # -- steps --------------------------------------------------------------------------------

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        """Return the loss (a scalar tensor), a dict with ``"loss"``, or ``None`` to skip the batch."""
        raise NotImplementedError(f"{type(self).__name__}.training_step() is not defined; Trainer.fit() needs it.")

    def validation_step(self, batch: Any, batch_idx: int, *args: Any) -> Any:
        """Compute and :meth:`log` validation metrics. With several dataloaders, the third
        argument is the dataloader's index."""
        raise NotImplementedError(
            f"{type(self).__name__}.validation_step() is not defined; validation needs it (or pass no val data)."
        )

    def test_step(self, batch: Any, batch_idx: int, *args: Any) -> Any:
        """Compute and :meth:`log` test metrics (third argument: dataloader index, with several)."""
        raise NotImplementedError(f"{type(self).__name__}.test_step() is not defined; Trainer.test() needs it.")

    def predict_step(self, batch: Any, batch_idx: int, *args: Any) -> Any:
        """Return the prediction for ``batch``; by default ``self(batch)``."""
        return self(batch)

    # -- data (used when the Trainer is given none) -------------------------------------------

    def train_dataloader(self) -> Any:
        """Training data for :meth:`Trainer.fit` when it is called without ``train_dataloaders``."""
        raise NotImplementedError(
            f"Trainer.fit() got no train_dataloaders and {type(self).__name__} defines no train_dataloader()."
        )

    def val_dataloader(self) -> Any:
        """Validation data when :meth:`Trainer.fit`/``validate`` get none; ``None`` means no validation."""
        return None

    def test_dataloader(self) -> Any:
        """Test data for :meth:`Trainer.test` when it is called without ``dataloaders``."""
        raise NotImplementedError(
            f"Trainer.test() got no dataloaders and {type(self).__name__} defines no test_dataloader()."
        )

    def predict_dataloader(self) -> Any:
        """Prediction data for :meth:`Trainer.predict` when it is called without ``dataloaders``."""
        raise NotImplementedError(
            f"Trainer.predict() got no dataloaders and {type(self).__name__} defines no predict_dataloader()."
        )

    # -- hooks ----------------------------------------------------------------------------------

    def on_fit_start(self) -> None:
        """Called once per fit, after setup and checkpoint restore, before the sanity check."""

    def on_fit_end(self) -> None:
        """Called once per fit, after training ended (not after an error)."""

    def on_train_start(self) -> None:
        """Called before the first training batch (after the sanity check)."""

    def on_train_end(self) -> None:
        """Called after the last training batch and its epoch-end hooks."""

    def on_train_epoch_start(self) -> None:
        """Called at the start of every training epoch."""

    def on_train_epoch_end(self) -> None:
        """Called after every completed training epoch, after its validation."""

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """Called before every training step."""

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Called after every training step (and optimizer step, when one was due)."""

    def on_validation_epoch_start(self) -> None:
        """Called before validation data is run."""

    def on_validation_epoch_end(self) -> None:
        """Called after all validation dataloaders ran; metrics logged here apply to all of them."""

    def on_test_epoch_start(self) -> None:
        """Called before test data is run."""

    def on_test_epoch_end(self) -> None:
        """Called after all test dataloaders ran."""

    def on_predict_epoch_start(self) -> None:
        """Called before prediction data is run."""

    def on_predict_epoch_end(self) -> None:
        """Called after all prediction dataloaders ran."""

    def on_before_backward(self, loss: torch.Tensor) -> None:
        """Called before every training backward (after the callbacks' hook), with the loss it runs on."""

    def on_after_backward(self) -> None:
        """Called after every training backward (after the callbacks' hook): the gradients are there."""

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Called before each optimizer step and its gradient clipping (after the callbacks' hook)."""

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Add entries to ``checkpoint`` before it is saved (``"module"``/``"optimizers"`` are live objects)."""

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Read the entries you added; called after weights and optimizer states were loaded,
        with the checkpoint's remaining entries."""

    # -- logging --------------------------------------------------------------------------------

    def log(
        self,
        name: str,
        value: torch.Tensor | float | int,
        prog_bar: bool = False,
        logger: bool = True,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        sync_dist: bool = False,
        reduce_fx: ReduceFx | Callable[..., Any] = "mean",
        batch_size: int | None = None,
    ) -> None:
        """Record a metric: it appears in ``trainer.callback_metrics``, the loggers and (with
        ``prog_bar=True``) the progress bar.

        In ``training_step`` a value is kept per step by default (``on_step=True``); in
        validation and test it is aggregated over the epoch (``on_epoch=True``) with
        ``reduce_fx`` (``"mean"`` weighted by ``batch_size``, ``"sum"``, ``"max"``, ``"min"``).
        Both on: the metric appears as ``name_step`` and ``name_epoch``. ``sync_dist=True``
        reduces the value over all ranks through the strategy (per step, or once per epoch
        for epoch values). ``torch.mean``/``sum``/``max``/``min`` are accepted for ``reduce_fx``
        as well.
        """
        if self._run_context is None:
            warnings.warn(
                f"{type(self).__name__}.log({name!r}) was called outside a Trainer run; the value is dropped.",
                stacklevel=2,
            )
            return
        self._run_context.metrics.log(
            name,
            value,
            prog_bar=prog_bar,
            logger=logger,
            on_step=on_step,
            on_epoch=on_epoch,
            sync_dist=sync_dist,
            reduce_fx=reduce_fx,
            batch_size=batch_size,
        )

    def log_dict(
        self,
        metrics: Mapping[str, torch.Tensor | float | int],
        prog_bar: bool = False,
        logger: bool = True,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        sync_dist: bool = False,
        reduce_fx: ReduceFx | Callable[..., Any] = "mean",
        batch_size: int | None = None,
    ) -> None:
        """:meth:`log` every item of ``metrics`` with the same options."""
        for name, value in metrics.items():
            self.log(
                name,
                value,
                prog_bar=prog_bar,
                logger=logger,
                on_step=on_step,
                on_epoch=on_epoch,
                sync_dist=sync_dist,
                reduce_fx=reduce_fx,
                batch_size=batch_size,
            )

    def optimizers(self, use_pl_optimizer: bool = True) -> Any:
        """The optimizers of the current fit as the strategy set them up: the optimizer itself when there is one,
        else a list, as in Lightning. Under manual optimization each is handed out wrapped, so that its ``step()``
        goes through the strategy and counts towards ``global_step``; ``use_pl_optimizer=False`` gives the
        optimizers themselves."""
        manual = self._run_context.manual if self._run_context is not None else None
        found: list[Any] = list(manual.optimizers) if manual is not None and use_pl_optimizer else []
        if not found:
            found = list(self.trainer.optimizers)
        return found[0] if len(found) == 1 else found

    def lr_schedulers(self) -> Any:
        """The learning-rate schedulers of the current fit: ``None`` when there are none, the scheduler when
        there is one, else a list, as in Lightning."""
        schedulers = [config.scheduler for config in self.trainer.lr_scheduler_configs]
        if not schedulers:
            return None
        return schedulers[0] if len(schedulers) == 1 else schedulers

    # -- manual optimization (automatic_optimization = False) -------------------------------------

    def manual_backward(self, loss: torch.Tensor) -> None:
        """Compute the gradients of ``loss`` in ``training_step`` under manual optimization, through the
        strategy: the precision's loss scaling, gradient synchronisation across ranks, the hooks around
        backward. Use it instead of ``loss.backward()``."""
        manual = self._run_context.manual if self._run_context is not None else None
        if manual is None:
            raise RuntimeError(
                f"{type(self).__name__}.manual_backward() is for training_step under manual optimization: set "
                "self.automatic_optimization = False in __init__ (with automatic optimization, return the loss "
                "from training_step and the Trainer runs backward)."
            )
        manual.backward(loss)

    def toggle_optimizer(self, optimizer: Any) -> None:
        """Leave only ``optimizer``'s parameters requiring gradients (the other optimizers' are frozen) until
        :meth:`untoggle_optimizer`: a backward then computes gradients for the model ``optimizer`` steps only."""
        target = getattr(optimizer, "optimizer", optimizer)
        if "_requires_grad_before_toggle" in self.__dict__:
            raise RuntimeError(
                f"{type(self).__name__}.toggle_optimizer() was called again before untoggle_optimizer(); untoggle "
                "the optimizer toggled first."
            )
        # Keyed by identity: a tensor's == compares values.
        before: dict[int, tuple[torch.Tensor, bool]] = {}
        for each in self.trainer.optimizers:
            for group in each.param_groups:
                for parameter in group["params"]:
                    before.setdefault(id(parameter), (parameter, parameter.requires_grad))
                    parameter.requires_grad_(False)
        for group in target.param_groups:
            for parameter in group["params"]:
                parameter.requires_grad_(before[id(parameter)][1])
        self.__dict__["_requires_grad_before_toggle"] = before

    def untoggle_optimizer(self, optimizer: Any) -> None:
        """Give every parameter back the ``requires_grad`` it had before :meth:`toggle_optimizer`."""
        before = self.__dict__.pop("_requires_grad_before_toggle", None)
        if before is None:
            return
        for parameter, requires_grad in before.values():
            parameter.requires_grad_(requires_grad)

    @contextlib.contextmanager
    def toggled_optimizer(self, optimizer: Any) -> Iterator[None]:
        """:meth:`toggle_optimizer` for the ``with`` block, untoggled when it ends."""
        self.toggle_optimizer(optimizer)
        try:
            yield
        finally:
            self.untoggle_optimizer(optimizer)

    def clip_gradients(
        self,
        optimizer: Any,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: Literal["norm", "value"] = "norm",
    ) -> torch.Tensor | None:
        """Clip the gradients of ``optimizer``'s parameters through the strategy (sharded gradients by their whole
        norm; a loss scaler's gradients unscaled first); the norm when clipping by norm. Under manual optimization
        call it after :meth:`manual_backward` and before ``optimizer.step()``; ``None`` clips nothing."""
        if gradient_clip_val is None:
            return None
        if gradient_clip_algorithm not in ("norm", "value"):
            raise ValueError(
                f"gradient_clip_algorithm={gradient_clip_algorithm!r} is not valid; expected 'norm' or 'value'."
            )
        target = getattr(optimizer, "optimizer", optimizer)
        return self.trainer.runtime.clip_gradients_as(target, gradient_clip_val, gradient_clip_algorithm)
