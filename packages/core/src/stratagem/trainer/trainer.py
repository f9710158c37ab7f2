"""The Trainer: runs a Module's fit / validate / test / predict on whatever strategy was chosen."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn

from stratagem.callbacks.callback import Callback, RunStage
from stratagem.callbacks.model_checkpoint import ModelCheckpoint
from stratagem.callbacks.model_summary import ModelSummary
from stratagem.callbacks.progress_bar import ProgressBar
from stratagem.checkpoint_io import PathLike
from stratagem.connector import ResolveOptions, auto_strategy_name, resolve, takes_resolve_options, wiring_options
from stratagem.loggers.csv_logger import CSVLogger
from stratagem.loggers.logger import Logger
from stratagem.module import Module
from stratagem.planning.auto import choice_for_workers, choose_strategy
from stratagem.runtime.runtime import Runtime
from stratagem.strategies import (
    ChecksModuleBeforeLaunch,
    ChecksRunBeforeLaunch,
    LoopSettings,
    Strategy,
    SuppliesOptimizer,
)
from stratagem.strategies.compilation import CompileSettings, parse_compile_option, unwrap_compiled
from stratagem.trainer.agreement import agree_on_checkpoint, check_checkpoint_directories_shared
from stratagem.trainer.checkpointing import (
    build_checkpoint,
    resolve_ckpt_path,
    restore_fit,
    restore_weights,
)
from stratagem.trainer.data import as_loader_list, check_splittable, with_distributed_sampler
from stratagem.trainer.evaluation_loop import EvaluationKind, run_evaluation
from stratagem.trainer.fit_loop import FitLoop
from stratagem.trainer.lightning_hooks import check_lightning_hooks
from stratagem.trainer.manual_optimization import check_manual_optimization
from stratagem.trainer.optimizers import SchedulerConfig, configured_optimizers
from stratagem.trainer.predict_loop import run_prediction
from stratagem.trainer.progress import FitProgress, Throughput
from stratagem.trainer.rng import seed_everything, with_seeded_workers, worker_seeding_requested
from stratagem.trainer.run_context import RunContext
from stratagem.trainer.settings import SETTING_NAMES, NonFinite, parse_settings
from stratagem.trainer.worker_output import WorkerOutput

if TYPE_CHECKING:
    from typing_extensions import Unpack

LoggerArgument = bool | str | Logger | Iterable[str | Logger] | None


class Trainer:
    """Fits, validates, tests and predicts with a :class:`~stratagem.Module` on any registered strategy.

    Construction resolves ``accelerator``/``strategy``/``devices``/``num_nodes``/``precision``/
    ``plugins``/``layout`` through :func:`stratagem.resolve` and checks every loop option, so a bad value
    fails here, before any process starts. In every worker the Trainer drives the strategy through
    :attr:`runtime`, the :class:`~stratagem.Runtime` a user's own loop drives, so the order of the strategy's
    calls is written once; the loops never look at which strategy runs. ``precision=None`` means the precision
    of a strategy instance or precision plugin, else ``"32-true"``.

    ``max_epochs``/``max_steps``: when to stop (neither given: 1000 epochs; ``-1``: no limit).
    ``limit_*_batches``: how much data a pass reads (an int number of batches or a fraction).
    ``val_check_interval``: validate every fraction of an epoch (float) or every N training
    batches (int; counted over epochs when ``check_val_every_n_epoch=None``).
    ``num_sanity_val_steps``: validation batches run before training to catch bugs early.
    ``accumulate_grad_batches``, ``gradient_clip_val``, ``gradient_clip_algorithm``: stepping.
    ``default_root_dir``: where logs and checkpoints go (default: the working directory).
    ``logger``: ``True`` (CSV), ``False``, ``"csv"``, ``"tensorboard"``, a Logger, or a list.
    ``callbacks``: extra :class:`~stratagem.callbacks.Callback` objects; ``enable_progress_bar``,
    ``enable_checkpointing`` and ``enable_model_summary`` add the default ProgressBar, ModelCheckpoint and
    :class:`~stratagem.callbacks.ModelSummary` (what is trained, and each rank's share, said as fit starts).
    ``seed`` seeds every generator at construction and in every worker with :func:`stratagem.seed_everything`
    (DataLoader workers too when ``seed_everything(..., workers=True)`` was called); ``deterministic`` turns on torch's
    deterministic algorithms during runs. ``use_distributed_sampler=False`` leaves dataloaders
    as given when the strategy splits data.
    ``nonfinite``: what a training step whose loss, or gradient norm where ``gradient_clip_val`` has it computed,
    is NaN or infinite does: ``"error"`` (default) stops the run at that step, before the optimizer steps, naming
    the step, the batch and the ranks; ``"skip"`` skips that batch's backward (or the optimizer step, for a
    gradient norm) on every rank and trains on; ``"ignore"`` checks nothing. ``max_time`` (a timedelta, a dict of its
    keywords such as ``{"hours": 1}``, or ``"DD:HH:MM:SS"``) ends a fit at the first optimizer step boundary after
    that much training time on any rank, on every rank together, saving as a fit's end does. ``fast_dev_run=N``
    (``True``: 1) runs N batches of each pass, one epoch, no sanity check, and writes no checkpoint and no logs.
    Every rank of a run must agree on
    whether a batch gave a loss (``training_step`` returning ``None``); ranks that do not are an error naming them.
    """

    @takes_resolve_options
    def __init__(
        self,
        *,
        max_epochs: int | None = None,
        max_steps: int = -1,
        limit_train_batches: int | float = 1.0,
        limit_val_batches: int | float = 1.0,
        limit_test_batches: int | float = 1.0,
        limit_predict_batches: int | float = 1.0,
        val_check_interval: int | float = 1.0,
        check_val_every_n_epoch: int | None = 1,
        num_sanity_val_steps: int = 2,
        accumulate_grad_batches: int = 1,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: Literal["norm", "value"] = "norm",
        default_root_dir: PathLike | None = None,
        enable_progress_bar: bool = True,
        enable_checkpointing: bool = True,
        enable_model_summary: bool = True,
        logger: LoggerArgument = True,
        callbacks: Callback | Iterable[Callback] | None = None,
        log_every_n_steps: int = 50,
        deterministic: bool = False,
        seed: int | None = None,
        use_distributed_sampler: bool = True,
        nonfinite: NonFinite = "error",
        compile: bool | dict[str, Any] | None = False,
        max_time: timedelta | Mapping[str, float] | str | None = None,
        fast_dev_run: bool | int = False,
        **resolve_options: Unpack[ResolveOptions],
    ) -> None:
        self.compile_settings = parse_compile_option(compile)
        # The loop options are the parameters named like TrainerSettings' fields; parse_settings checks them all.
        arguments = locals()
        self.settings = parse_settings({name: arguments[name] for name in SETTING_NAMES})
        self.callbacks = _arrange_callbacks(callbacks, enable_progress_bar, enable_checkpointing, enable_model_summary)
        self.loggers = [] if self.settings.fast_dev_run else _make_loggers(logger, self.settings.default_root_dir)
        self.strategy = resolve(**resolve_options)
        # "auto" is settled by the first fit, which sees the model: see _plan_strategy.
        self._auto_request = (
            wiring_options(resolve_options) if resolve_options.get("strategy", "auto") == "auto" else None
        )
        self._runtime = Runtime.around(self.strategy)
        self._runtime.connect_loop_settings(
            LoopSettings(
                accumulate_grad_batches=self.settings.accumulate_grad_batches,
                gradient_clip_val=self.settings.gradient_clip_val,
                gradient_clip_algorithm=self.settings.gradient_clip_algorithm,
            )
        )
        if self.settings.deterministic:
            # Read by cuBLAS when the first handle is created; children inherit it.
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        if self.settings.seed is not None:
            seed_everything(self.settings.seed, workers=worker_seeding_requested())

        self.fit_progress = FitProgress()
        self.optimizers: list[torch.optim.Optimizer] = []
        self.lr_scheduler_configs: list[SchedulerConfig] = []
        self.should_stop = False
        self.stage: RunStage | None = None
        self.sanity_checking = False
        self.throughput = Throughput()
        self.last_evaluation_metrics: dict[str, float] = {}
        self.num_training_batches: int | None = None
        self.estimated_total_steps: int | None = None
        self.epoch_start_state: dict[str, Any] | None = None
        self._module: Module | None = None
        self._context = RunContext.for_callbacks(self.callbacks)

    def __getstate__(self) -> dict[str, Any]:
        # What a spawned worker needs is the configuration; the live objects of a previous run
        # stay here (the module travels as its own argument).
        state = self.__dict__.copy()
        state.update(_context=None, _module=None, optimizers=[], lr_scheduler_configs=[])
        state["_logged_metrics"] = self._context.metrics
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        metrics = state.pop("_logged_metrics")
        self.__dict__.update(state)
        self._context = RunContext.for_callbacks(self.callbacks, metrics)

    # -- what users read ------------------------------------------------------------------------

    @property
    def model(self) -> nn.Module | None:
        """The module as the strategy wrapped it (DDP, the FSDP root, DeepSpeed's engine, ...) during a run in
        this process; ``None`` before one (Lightning's ``trainer.model``). The unwrapped one is ``strategy.module``."""
        try:
            return self.strategy.model
        except RuntimeError:
            return None

    @property
    def runtime(self) -> Runtime:
        """The :class:`~stratagem.Runtime` around :attr:`strategy` that the loops drive it through (made again,
        with the loop settings, when the strategy is replaced)."""
        if self._runtime.strategy is not self.strategy:
            self._use_strategy(self.strategy)
        return self._runtime

    def _use_strategy(self, strategy: Strategy) -> None:
        """Run on ``strategy`` from now on, through a Runtime around it told the loop settings the last one had."""
        settings = self._runtime.loop_settings
        self.strategy = strategy
        self._runtime = Runtime.around(strategy)
        self._runtime.connect_loop_settings(settings)

    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far (over all fits resumed from each other)."""
        return self.fit_progress.global_step

    @property
    def current_epoch(self) -> int:
        """The epoch in progress (after a finished fit: the number of completed epochs)."""
        return self.fit_progress.epoch

    @property
    def callback_metrics(self) -> dict[str, torch.Tensor]:
        """The latest value of every logged metric (step values and epoch aggregates)."""
        return self._context.metrics.callback_metrics

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        """``loss`` and the metrics logged with ``prog_bar=True``, as floats (reading them syncs the device)."""
        last_loss = self._context.last_loss
        metrics = {"loss": float(last_loss.detach())} if last_loss is not None else {}
        metrics.update(self._context.metrics.progress_bar_metrics())
        return metrics

    @property
    def is_global_zero(self) -> bool:
        return self.strategy.is_global_zero

    @property
    def world_size(self) -> int:
        return self.strategy.world_size

    @property
    def global_rank(self) -> int:
        return self.strategy.global_rank

    @property
    def default_root_dir(self) -> Path:
        return self.settings.default_root_dir

    @property
    def max_epochs(self) -> int:
        return self.settings.max_epochs

    @property
    def max_steps(self) -> int:
        return self.settings.max_steps

    @property
    def fast_dev_run(self) -> int:
        """Batches per pass of a quick check run (``fast_dev_run=True`` is 1); ``0`` when off."""
        return self.settings.fast_dev_run

    @property
    def logger(self) -> Logger | None:
        """The first logger, or ``None``."""
        return self.loggers[0] if self.loggers else None

    @property
    def log_dir(self) -> str | None:
        """Where the first logger writes, or ``default_root_dir`` when there is no logger."""
        return self.logger.log_dir if self.logger is not None else str(self.default_root_dir)

    @property
    def checkpoint_callbacks(self) -> list[ModelCheckpoint]:
        return [callback for callback in self.callbacks if isinstance(callback, ModelCheckpoint)]

    @property
    def checkpoint_callback(self) -> ModelCheckpoint | None:
        """The first ModelCheckpoint, or ``None``."""
        found = self.checkpoint_callbacks
        return found[0] if found else None

    # -- running --------------------------------------------------------------------------------

    def fit(
        self,
        module: Module,
        train_dataloaders: Any = None,
        val_dataloaders: Any = None,
        ckpt_path: PathLike | Literal["last", "best"] | None = None,
        weights_only: bool = True,
    ) -> None:
        """Train ``module``. ``ckpt_path`` (a path, ``"last"`` or ``"best"``) resumes exactly where that
        checkpoint was saved. Without dataloaders, ``module.train_dataloader()``/``val_dataloader()`` are used.
        ``weights_only=False`` allows checkpoints with arbitrary pickled objects (only for files you trust)."""
        self._run("fit", module, (train_dataloaders, val_dataloaders), ckpt_path, weights_only)

    def validate(
        self,
        module: Module,
        dataloaders: Any = None,
        ckpt_path: PathLike | Literal["last", "best"] | None = None,
        weights_only: bool = True,
    ) -> list[dict[str, float]]:
        """Run ``validation_step`` over the data; one dict of logged metrics per dataloader, the same on every rank."""
        output = self._run("validate", module, (dataloaders,), ckpt_path, weights_only)
        return output.results

    def test(
        self,
        module: Module,
        dataloaders: Any = None,
        ckpt_path: PathLike | Literal["last", "best"] | None = None,
        weights_only: bool = True,
    ) -> list[dict[str, float]]:
        """Run ``test_step`` over the data; one dict of logged metrics per dataloader, the same on every rank."""
        output = self._run("test", module, (dataloaders,), ckpt_path, weights_only)
        return output.results

    def predict(
        self,
        module: Module,
        dataloaders: Any = None,
        ckpt_path: PathLike | Literal["last", "best"] | None = None,
        weights_only: bool = True,
    ) -> Any:
        """``predict_step`` outputs, one per batch (a list per dataloader with several). A strategy that
        splits data gives each rank its share; after a spawned run the caller gets rank 0's."""
        output = self._run("predict", module, (dataloaders,), ckpt_path, weights_only)
        return output.predictions

    def save_checkpoint(self, path: PathLike) -> None:
        """Save the current module, optimizers, schedulers, loop progress, RNG, callback and precision state.

        Call it on every rank (as hooks and callbacks are): strategies that shard save collectively. During a
        run every rank returns once the checkpoint is complete. After ``fit``/``validate``/``test`` has returned,
        a strategy whose processes each hold the whole state (``single_device``, ``ddp``) saves from global
        rank 0, and the other ranks return at once; ``fsdp``, whose processes each still hold their shards,
        joins the ranks again to save them together; ``deepspeed`` raises before writing anything, because
        its engine went with the run: save from a callback or ModelCheckpoint there.
        """
        module = self._module
        if module is None:
            raise RuntimeError(
                "Trainer.save_checkpoint() needs a module and its optimizers from a run in this process: call it "
                "during or after fit/validate/test, in a process that ran them. A strategy that starts its workers "
                "from this process (spawn, fork) hands the trained weights back here, but not the optimizer state: "
                "save from a hook or callback (on_train_end, say), let ModelCheckpoint do it, or keep only the "
                "weights with torch.save(module.state_dict(), path)."
            )
        checkpoint = build_checkpoint(self, module)
        module.on_save_checkpoint(checkpoint)
        self._context.hooks.call("on_save_checkpoint", self, module, checkpoint)
        self.runtime.save(path, checkpoint)

    @contextlib.contextmanager
    def init_module(self, empty_init: bool = False) -> Iterator[None]:
        """Create modules in this context to build them directly on the device and in the precision's
        dtype (sharded strategies may build them sharded). ``empty_init=True`` skips the random
        initialisation, for weights that a checkpoint will overwrite."""
        with self.strategy.module_init_context(empty_init):
            yield

    def log_to_loggers(self, metrics: dict[str, float]) -> None:
        """Send ``metrics`` to every logger at the current step (global zero only)."""
        if not self.is_global_zero:
            return
        metrics = {**metrics, "epoch": self.current_epoch}
        for logger in self.loggers:
            logger.log_metrics(metrics, self.global_step)

    # -- in the calling process -----------------------------------------------------------------

    def _run(
        self,
        stage: RunStage,
        module: Module,
        dataloaders: tuple[Any, ...],
        ckpt_path: Any,
        weights_only: bool,
    ) -> WorkerOutput:
        module, compiled_with = unwrap_compiled(module)
        if not isinstance(module, Module):
            raise TypeError(
                f"Trainer.{stage}() needs a stratagem.Module; got {type(module).__name__}. Subclass stratagem.Module."
            )
        if compiled_with is not None and self.compile_settings is not None:
            raise ValueError(
                f"Trainer.{stage}() got torch.compile({type(module).__name__}) from a Trainer made with "
                f"{self.compile_settings.description}: say once how to compile. Pass the module uncompiled, or make "
                "the Trainer with compile=False."
            )
        compile_settings = compiled_with or self.compile_settings
        if not isinstance(weights_only, bool):
            raise TypeError(f"weights_only={weights_only!r} is not valid; expected True or False.")
        planned, kept = (
            self._plan_strategy(module) if stage == "fit" and self._auto_request is not None else (None, None)
        )
        if isinstance(self.strategy, ChecksRunBeforeLaunch):
            self.strategy.check_run(stage)
        if isinstance(self.strategy, ChecksModuleBeforeLaunch):
            self.strategy.check_module(module, stage)
        if stage == "fit":
            check_manual_optimization(module, self.strategy, self.settings)
            manual = not module.automatic_optimization
            runtime = self.runtime
            if manual != runtime.loop_settings.manual_optimization:
                runtime.connect_loop_settings(dataclasses.replace(runtime.loop_settings, manual_optimization=manual))
            for callback in self.callbacks:
                if isinstance(callback, ModelSummary):
                    callback.describe(module, self.strategy, kept)
        checkpoint = resolve_ckpt_path(self, ckpt_path, stage)
        loaders = [as_loader_list(value, name) for value, name in zip(dataloaders, _ARGUMENT_NAMES[stage])]
        if self.settings.use_distributed_sampler and self.strategy.distributed_sampler_kwargs is not None:
            for group, name in zip(loaders, _ARGUMENT_NAMES[stage]):
                for loader in group:
                    check_splittable(loader, name)
        if stage == "fit" and loaders[0]:
            # Known here when given to fit(): a strategy that must agree with it errs before any process starts.
            self._connect_train_batch_size(loaders[0])
        check_lightning_hooks(module)
        module._attach_run(self, self._context)
        launcher = self.strategy.launcher
        # Decided here, in the caller: inside a started worker the strategy sees ranks that already
        # exist and would pick an in-place launcher, which says nothing about who called.
        returns_to_caller = not launcher.caller_is_worker
        with choice_for_workers(planned) if planned is not None else contextlib.nullcontext():
            output: WorkerOutput = launcher.launch(
                self._run_in_worker,
                stage,
                module,
                loaders,
                checkpoint,
                weights_only,
                returns_to_caller,
                compile_settings,
            )
        if returns_to_caller:
            output.apply(self, self._context, module)
        return output

    def _plan_strategy(self, module: Module) -> tuple[str, str | None]:
        """Replace the strategy ``auto`` resolved without a model by the fastest one the model fits in (once per
        Trainer), saying why on stderr when that is not the usual choice; return the name for the workers, and
        the reason when it kept the usual choice (for the model summary)."""
        request, self._auto_request = self._auto_request, None
        assert request is not None
        default = auto_strategy_name(self.strategy.world_size, request.get("layout"))
        name, reason = choose_strategy(module, request, default, device=self.strategy.root_device)
        if name != default:
            self._use_strategy(resolve(strategy=name, **request))
            if reason is not None:
                print(f"stratagem: {reason}", file=sys.stderr, flush=True)
            return name, None
        return name, reason

    # -- in every worker ------------------------------------------------------------------------

    def _run_in_worker(
        self,
        stage: RunStage,
        module: Module,
        loaders: list[list[Iterable[Any]]],
        checkpoint: str | None,
        weights_only: bool,
        returns_to_caller: bool,
        compile_settings: CompileSettings | None,
    ) -> WorkerOutput:
        runtime = self.runtime
        # The order of the strategy's calls is the lifecycle's, shared with a user's own loop.
        lifecycle = runtime.lifecycle
        module._attach_run(self, self._context)
        self._module = module
        self._context.metrics.runtime = runtime
        self.stage = stage
        self.should_stop = False
        deterministic_before = torch.are_deterministic_algorithms_enabled()
        status = "failed"
        try:
            if returns_to_caller:
                _make_tensors_private(module)
            lifecycle.start()
            checkpoint = agree_on_checkpoint(self, checkpoint)
            if self.settings.deterministic:
                torch.use_deterministic_algorithms(True)
            if self.settings.seed is not None:
                seed_everything(self.settings.seed, workers=worker_seeding_requested())
            # Without a checkpoint the strategy decides how to create initialised weights (None, not False):
            # sharded strategies build on the meta device and initialise each rank's shards.
            with lifecycle.module_init_context(empty_init=True if checkpoint is not None else None):
                module.configure_model()
            lifecycle.setup_module(module)
            if stage == "fit":
                # Before the optimizers: an engine built with them (DeepSpeed) is sized by the batch.
                train = self._loaders(module, "fit", loaders[0], required=True)
                if len(train) != 1:
                    raise ValueError(f"Trainer.fit() takes one training dataloader; got {len(train)}.")
                self._connect_train_batch_size(train)
                supplies = isinstance(self.strategy, SuppliesOptimizer) and self.strategy.supplies_optimizer
                setup = configured_optimizers(module, supplies)
                schedulers = [config.scheduler for config in setup.schedulers]
                self.optimizers = lifecycle.setup_optimizers(setup.optimizers, schedulers)
                self.lr_scheduler_configs = setup.schedulers
            if compile_settings is not None:
                lifecycle.compile(compile_settings)
            self._context.hooks.call("setup", self, module, stage)
            if stage == "fit" and not self.settings.fast_dev_run:
                check_checkpoint_directories_shared(self)
            results: list[dict[str, float]] = []
            predictions = None
            if stage == "fit":
                self._fit(module, train[0], loaders[1], checkpoint, weights_only)
            else:
                if checkpoint is not None:
                    restore_weights(self, module, checkpoint, weights_only)
                data = self._loaders(module, stage, loaders[0], required=True)
                if stage == "predict":
                    predictions = run_prediction(self, self._context, module, data, self.settings.limit_predict_batches)
                else:
                    results = self._evaluate(module, stage, data)
            output = WorkerOutput.collect(self, self._context, results, predictions, returns_to_caller)
            status = "success"
            return output
        except BaseException as exception:
            self._context.hooks.call("on_exception", self, module, exception)
            raise
        finally:
            self._context.metrics.stage = None
            self._context.metrics.batch = None
            self.stage = None
            try:
                self._context.hooks.call("teardown", self, module, stage)
                if self.is_global_zero:
                    for logger in self.loggers:
                        logger.finalize(status)
            finally:
                lifecycle.teardown()
                torch.use_deterministic_algorithms(deterministic_before)

    def _fit(
        self,
        module: Module,
        train: Iterable[Any],
        given_val: list[Iterable[Any]],
        checkpoint: str | None,
        weights_only: bool,
    ) -> None:
        val = self._loaders(module, "validate", given_val, required=False)
        checkpoint_rng = None
        if checkpoint is not None:
            checkpoint_rng = restore_fit(self, module, checkpoint, weights_only).get("rng")
        FitLoop(self, self._context, module, train, val).run(checkpoint_rng)

    def _connect_train_batch_size(self, train: list[Iterable[Any]]) -> None:
        size = getattr(train[0], "batch_size", None) if len(train) == 1 else None
        size = size if isinstance(size, int) else None
        runtime = self.runtime
        if size != runtime.loop_settings.train_batch_size:
            runtime.connect_loop_settings(dataclasses.replace(runtime.loop_settings, train_batch_size=size))

    def _evaluate(self, module: Module, stage: RunStage, loaders: list[Iterable[Any]]) -> list[dict[str, float]]:
        kind: EvaluationKind = "validation" if stage == "validate" else "test"
        limit = self.settings.limit_val_batches if kind == "validation" else self.settings.limit_test_batches
        return run_evaluation(self, self._context, module, loaders, kind, limit)

    def _loaders(
        self, module: Module, stage: RunStage, given: list[Iterable[Any]], required: bool
    ) -> list[Iterable[Any]]:
        """The dataloaders of a pass: the given ones, else the module's, split across ranks when the strategy
        splits data."""
        loaders = given
        if not loaders:
            from_module = {
                "fit": module.train_dataloader,
                "validate": module.val_dataloader,
                "test": module.test_dataloader,
                "predict": module.predict_dataloader,
            }[stage]()
            loaders = as_loader_list(from_module, f"{type(module).__name__}.{stage} dataloader")
        if required and not loaders:
            raise ValueError(f"Trainer.{stage}() got no dataloaders and {type(module).__name__} provides none.")
        sampler_kwargs = self.strategy.distributed_sampler_kwargs if self.settings.use_distributed_sampler else None
        seed = self.settings.seed or 0
        shuffle = None if stage == "fit" else False
        split = [with_distributed_sampler(loader, sampler_kwargs, seed, shuffle) for loader in loaders]
        if worker_seeding_requested():
            split = [with_seeded_workers(loader, self.runtime.global_rank) for loader in split]
        return self.runtime.rebuild_dataloaders(split, stage)


@torch.no_grad()
def _make_tensors_private(module: Module) -> None:
    """Give the module its own copy of tensors that arrived in shared memory.

    Tensors sent to a spawned process travel as shared memory, so every rank (and the caller)
    would otherwise update the same parameter storage.
    """
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        if tensor.is_shared():
            tensor.data = tensor.data.clone()


_ARGUMENT_NAMES: dict[str, tuple[str, ...]] = {
    "fit": ("train_dataloaders", "val_dataloaders"),
    "validate": ("dataloaders",),
    "test": ("dataloaders",),
    "predict": ("dataloaders",),
}


def _arrange_callbacks(
    callbacks: Callback | Iterable[Callback] | None,
    enable_progress_bar: bool,
    enable_checkpointing: bool,
    enable_model_summary: bool,
) -> list[Callback]:
    """User callbacks with the defaults added, ordered: progress bar first, checkpoints last (so they
    see what every other callback logged or decided)."""
    flags = (
        ("enable_progress_bar", enable_progress_bar),
        ("enable_checkpointing", enable_checkpointing),
        ("enable_model_summary", enable_model_summary),
    )
    for name, flag in flags:
        if not isinstance(flag, bool):
            raise TypeError(f"{name}={flag!r} is not valid; expected True or False.")
    if callbacks is None:
        given: list[Callback] = []
    elif isinstance(callbacks, Callback):
        given = [callbacks]
    elif isinstance(callbacks, Iterable):
        given = list(callbacks)
    else:
        raise TypeError(f"callbacks={callbacks!r} is not valid; expected a Callback or a list of Callbacks.")
    for callback in given:
        if not isinstance(callback, Callback):
            raise TypeError(
                f"callbacks= contains {callback!r} ({type(callback).__name__}); expected stratagem.callbacks.Callback "
                "instances."
            )
    bars = [callback for callback in given if isinstance(callback, ProgressBar)]
    checkpoints = [callback for callback in given if isinstance(callback, ModelCheckpoint)]
    others = [callback for callback in given if not isinstance(callback, ProgressBar | ModelCheckpoint)]
    if bars and not enable_progress_bar:
        raise ValueError("callbacks= contains a ProgressBar but enable_progress_bar=False; remove one of them.")
    if checkpoints and not enable_checkpointing:
        raise ValueError("callbacks= contains a ModelCheckpoint but enable_checkpointing=False; remove one of them.")
    if enable_progress_bar and not bars:
        bars = [ProgressBar()]
    if enable_checkpointing and not checkpoints:
        checkpoints = [ModelCheckpoint()]
    summaries = [callback for callback in others if isinstance(callback, ModelSummary)]
    if summaries and not enable_model_summary:
        raise ValueError("callbacks= contains a ModelSummary but enable_model_summary=False; remove one of them.")
    if enable_model_summary and not summaries:
        others = [*others, ModelSummary()]
    keys = [callback.state_key for callback in [*bars, *others, *checkpoints]]
    duplicates = sorted({key for key in keys if keys.count(key) > 1})
    if duplicates:
        raise ValueError(
            f"callbacks= contains several callbacks with the same state_key {duplicates}; their checkpoint states "
            "would overwrite each other. Give them different settings or override state_key."
        )
    return [*bars, *others, *checkpoints]


def _make_loggers(logger: LoggerArgument, root: Path) -> list[Logger]:
    accepted = "True, False, None, 'csv', 'tensorboard', a Logger, or a list of those"
    if logger is None or logger is False:
        return []
    if logger is True:
        return [CSVLogger(save_dir=root)]
    items = [logger] if isinstance(logger, str | Logger) else logger
    if not isinstance(items, Iterable):
        raise TypeError(f"logger={logger!r} is not valid; expected {accepted}.")
    loggers: list[Logger] = []
    for item in items:
        if isinstance(item, Logger):
            loggers.append(item)
        elif item == "csv":
            loggers.append(CSVLogger(save_dir=root))
        elif item == "tensorboard":
            from stratagem.loggers.tensorboard import TensorBoardLogger

            loggers.append(TensorBoardLogger(save_dir=root))
        else:
            raise ValueError(f"logger={logger!r} is not valid; expected {accepted}.")
    return loggers
