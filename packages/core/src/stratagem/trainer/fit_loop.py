"""The training loop: epochs of batches, optimizer steps through the run's Runtime, validation at intervals.

The loop calls the strategy only through :class:`~stratagem.Runtime` (the object a user's own loop drives), which
hands out the per-batch calls once. The per-batch path is kept short: what can be decided once (which hooks are
overridden, who accumulates gradients and how, which schedulers step per optimizer step, which strategy methods
are the base class's and can be called in their direct form) is decided before the loop.
"""

from __future__ import annotations

import math
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import islice
from typing import TYPE_CHECKING, Any

import torch

from stratagem.module import Module
from stratagem.trainer.accumulation import accumulation_policy
from stratagem.trainer.data import count_batches, set_epoch
from stratagem.trainer.evaluation_loop import run_evaluation
from stratagem.trainer.manual_optimization import ManualSteps
from stratagem.trainer.optimizers import step_schedulers
from stratagem.trainer.progress import Throughput
from stratagem.trainer.rng import capture_rng_state, loader_generators, restore_rng_state
from stratagem.trainer.step_checks import StepChecks
from stratagem.trainer.step_hooks import StepHooks

if TYPE_CHECKING:
    from stratagem.trainer.run_context import RunContext
    from stratagem.trainer.trainer import Trainer


class FitLoop:
    """Runs one ``Trainer.fit`` in a worker, from the restored progress to ``max_steps``/``max_epochs``."""

    def __init__(
        self,
        trainer: Trainer,
        context: RunContext,
        module: Module,
        train_loader: Iterable[Any],
        val_loaders: list[Iterable[Any]],
    ) -> None:
        settings = trainer.settings
        self.trainer = trainer
        self.module = module
        runtime = trainer.runtime
        self.runtime = runtime
        self.settings = settings
        self.progress = trainer.fit_progress
        self.context = context
        self.metrics = context.metrics
        self.hooks = context.hooks
        self.train_loader = train_loader
        self.val_loaders = val_loaders
        self.num_batches = count_batches(train_loader, settings.limit_train_batches, "limit_train_batches")
        self.optimizers = list(trainer.optimizers)
        self.accumulate = settings.accumulate_grad_batches
        self.automatic_optimization = module.automatic_optimization
        self.at_step_boundary = runtime.step_boundary
        self.feed = runtime.batch_feed
        self.stop_at_step = settings.max_steps if settings.max_steps != -1 else math.inf
        self.max_seconds = settings.max_time.total_seconds() if settings.max_time is not None else None
        self._train_start = time.perf_counter()
        self.backward_optimizer = self.optimizers[0] if len(self.optimizers) == 1 else None
        calls = runtime.step_calls("training_step", self.backward_optimizer)
        self.to_device = calls.batch_to_device
        self._training_step = calls.run_step
        self._backward = calls.backward
        self._step_optimizer = calls.optimizer_step
        self._zero_grad = calls.zero_grad
        self._clip = calls.clip_gradients
        self.accumulation = accumulation_policy(
            runtime, self.accumulate, self.optimizers, calls.optimizer_step, self.automatic_optimization
        )
        self.checks = StepChecks(runtime, settings.nonfinite, self.progress, not self.automatic_optimization)
        self.step_hooks = StepHooks(context.hooks, trainer, module)
        self._hooks_before_backward = bool(self.step_hooks.before_backward)
        self._hooks_after_backward = bool(self.step_hooks.after_backward)
        self._hooks_before_optimizer_step = bool(self.step_hooks.before_optimizer_step)
        self.manual: ManualSteps | None = None
        if not self.automatic_optimization:
            self.manual = ManualSteps(
                runtime.backward_preparation,
                self.optimizers,
                self._backward,
                self._step_optimizer,
                self.step_hooks,
                self.checks.loss_is_usable if self.checks.needed else None,
                self.at_step_boundary,
                self._count_manual_step,
            )
        self._checks_loss = self.checks.needed
        # Gradients a loss scaler already skips on are left to it (inf while it searches for its scale).
        self._checks_gradient_norm = (
            settings.nonfinite != "ignore"
            and runtime.reads_steps_on_host
            and not runtime.precision.skips_nonfinite_gradients
        )
        self._batch_idx = 0
        # A strategy that steps the schedulers itself gets none stepped here, per step or per epoch; neither
        # does a module that optimizes manually (its training_step steps them, as in Lightning).
        steps_own_schedulers = runtime.steps_lr_schedulers or not self.automatic_optimization
        self.scheduler_configs = [] if steps_own_schedulers else trainer.lr_scheduler_configs
        self.step_schedulers = [config for config in self.scheduler_configs if config.interval == "step"]
        self.validation_enabled = bool(val_loaders) and settings.limit_val_batches != 0
        self.logs_steps = trainer.is_global_zero and bool(trainer.loggers)
        self._window_has_grad = False
        self._pending_rng: dict[str, Any] | None = None
        self._validation_interval: int | None = None
        self._validation_counts_globally = False
        self._validate_this_epoch = False
        hooks = context.hooks
        self._batch_start_hooks = hooks.overriding("on_train_batch_start")
        self._batch_end_hooks = hooks.overriding("on_train_batch_end")
        self._module_batch_start = type(module).on_train_batch_start is not Module.on_train_batch_start
        self._module_batch_end = type(module).on_train_batch_end is not Module.on_train_batch_end

    # -- the whole fit --------------------------------------------------------------------------

    def run(self, checkpoint_rng: dict[str, Any] | None) -> None:
        self.context.manual = self.manual
        try:
            self._run(checkpoint_rng)
        finally:
            self.context.manual = None

    def _run(self, checkpoint_rng: dict[str, Any] | None) -> None:
        trainer, module, hooks = self.trainer, self.module, self.hooks
        trainer.num_training_batches = self.num_batches
        trainer.estimated_total_steps = self._estimated_total_steps()
        module.on_fit_start()
        hooks.call("on_fit_start", trainer, module)
        self._sanity_check()
        module.train()
        module.on_train_start()
        hooks.call("on_train_start", trainer, module)
        self._pending_rng = checkpoint_rng
        self.progress.start_next_epoch_if_finished()
        self.runtime.reset_peak_memory()
        start_step, start_time = self.progress.global_step, time.perf_counter()
        self._train_start = start_time
        while self.num_batches != 0 and not self._done() and not self._epochs_done():
            if not self._run_epoch():
                break
        seconds = time.perf_counter() - start_time
        trainer.throughput = Throughput(self.progress.global_step - start_step, seconds, self._peak_memory_per_rank())
        if self.logs_steps and self.progress.global_step % self.settings.log_every_n_steps != 0:
            # The last step's values are worth a row even between logging intervals.
            self._log_step_metrics()
        module.on_train_end()
        hooks.call("on_train_end", trainer, module)
        module.on_fit_end()
        hooks.call("on_fit_end", trainer, module)

    def _peak_memory_per_rank(self) -> tuple[int | None, ...]:
        runtime = self.runtime
        peak = runtime.peak_memory_bytes()
        if runtime.world_size == 1:
            return (peak,)
        # Every rank ends the loop here together: one exchange per fit.
        mine = torch.tensor([-1 if peak is None else peak], dtype=torch.int64, device=runtime.device)
        return tuple(None if value < 0 else value for value in runtime.all_gather(mine).flatten().tolist())

    def _done(self) -> bool:
        return self.trainer.should_stop or self.progress.global_step >= self.stop_at_step

    def _epochs_done(self) -> bool:
        max_epochs = self.settings.max_epochs
        return max_epochs != -1 and self.progress.epoch >= max_epochs

    def _estimated_total_steps(self) -> int | None:
        estimates = []
        if self.settings.max_steps != -1:
            estimates.append(self.settings.max_steps)
        if self.settings.max_epochs != -1 and self.num_batches is not None:
            estimates.append(self.settings.max_epochs * self.accumulation.optimizer_steps(self.num_batches))
        return min(estimates, default=None)

    def _sanity_check(self) -> None:
        steps = self.settings.num_sanity_val_steps
        if not self.validation_enabled or steps == 0:
            return
        trainer = self.trainer
        snapshot = self.metrics.snapshot()
        trainer.sanity_checking = True
        try:
            run_evaluation(
                trainer,
                self.context,
                self.module,
                self.val_loaders,
                "validation",
                self.settings.limit_val_batches,
                max_batches=None if steps == -1 else steps,
            )
        finally:
            trainer.sanity_checking = False
            self.metrics.restore(snapshot)
            trainer.last_evaluation_metrics = {}

    # -- one epoch ------------------------------------------------------------------------------

    def _run_epoch(self) -> bool:
        """Train one epoch (or its rest, when resuming); return False when the data gave no batch."""
        trainer, module, progress, metrics = self.trainer, self.module, self.progress, self.metrics
        skip = progress.batches_in_epoch
        batches = self._epoch_batches(skip)
        self._plan_validation(progress.epoch)
        metrics.stage = "train_step"
        module.on_train_epoch_start()
        self.hooks.call("on_train_epoch_start", trainer, module)
        self._window_has_grad = False
        finished = True
        steps_before = progress.global_step
        # One batch is the loop's body, with everything it reads bound here: on a small model every attribute
        # lookup and call the Trainer makes per batch is a measurable share of a step.
        start_hooks, end_hooks = self._batch_start_hooks, self._batch_end_hooks
        module_start, module_end = self._module_batch_start, self._module_batch_end
        to_device, run_batch = self.to_device, self.accumulation.run_batch
        accumulate, num_batches, stop_at = self.accumulate, self.num_batches, self.stop_at_step
        validation_interval = self._validation_interval if self._validate_this_epoch else None
        max_seconds = self.max_seconds
        for batch_idx, batch in enumerate(batches, start=skip):
            metrics.batch = batch
            for hook in start_hooks:
                hook(trainer, module, batch, batch_idx)
            if module_start:
                module.on_train_batch_start(batch, batch_idx)
            batch = to_device(batch)
            boundary = accumulate == 1 or (batch_idx + 1) % accumulate == 0 or batch_idx + 1 == num_batches
            steps_before_batch = progress.global_step
            output = run_batch(batch, batch_idx, boundary, self)
            progress.batches_in_epoch += 1
            progress.total_batches += 1
            for hook in end_hooks:
                hook(trainer, module, output, batch, batch_idx)
            if module_end:
                module.on_train_batch_end(output, batch, batch_idx)
            # Not kept through the next batch's step (a dict output may hold more than the loss).
            del output
            if (
                max_seconds is not None
                and progress.global_step != steps_before_batch
                and self._out_of_time(max_seconds)
            ):
                trainer.should_stop = True
            if validation_interval is not None:
                count = progress.total_batches if self._validation_counts_globally else batch_idx + 1
                if count % validation_interval == 0:
                    self._validate()
            if trainer.should_stop or progress.global_step >= stop_at:
                finished = num_batches is not None and progress.batches_in_epoch >= num_batches
                break
        if progress.batches_in_epoch == 0:
            warnings.warn("The training dataloader produced no batch; fitting stops.", stacklevel=2)
            return False
        if finished:
            trained = progress.batches_in_epoch - skip
            self._end_epoch()
            if progress.global_step == steps_before and trained > 0:
                raise RuntimeError(self._no_step_message(trained))
        return True

    def _out_of_time(self, max_seconds: float) -> bool:
        """Whether some rank has trained ``max_seconds``: one answer for every rank, which must stop together
        (a rank stopping alone would leave the others waiting in their next collective)."""
        elapsed = time.perf_counter() - self._train_start
        if not self.runtime.reduce_boolean(elapsed >= max_seconds, all_ranks=False):
            return False
        if self.trainer.is_global_zero:
            print(
                f"stratagem: max_time={self.settings.max_time} reached at step {self.progress.global_step}; stopping.",
                file=sys.stderr,
                flush=True,
            )
        return True

    def _no_step_message(self, batches: int) -> str:
        if self.manual is not None:
            return (
                f"Epoch {self.progress.epoch - 1} made no optimizer step in {batches} batches: training_step (with "
                "automatic_optimization = False) called step() on none of the optimizers self.optimizers() returns, "
                f"so the run would never advance (global_step stays at {self.progress.global_step})."
            )
        skipping = (
            ", or its step was skipped for a non-finite loss or gradient norm (nonfinite='skip'),"
            if self.settings.nonfinite == "skip"
            else ""
        )
        return (
            f"Epoch {self.progress.epoch - 1} made no optimizer step in {batches} batches: training_step returned "
            f"None{skipping} for every one of them, so the run would never advance (global_step stays at "
            f"{self.progress.global_step}). Return the loss from training_step."
        )

    def _epoch_batches(self, skip: int) -> Iterator[Any]:
        """The epoch's batch iterator, positioned after ``skip`` batches, with the random generators
        as an uninterrupted run would have them there."""
        trainer, loader = self.trainer, self.train_loader
        generators = loader_generators(loader)
        resuming_mid_epoch = skip > 0 and trainer.epoch_start_state is not None
        if not resuming_mid_epoch and self._pending_rng is not None:
            restore_rng_state(self._pending_rng)
            self._pending_rng = None
        if resuming_mid_epoch:
            assert trainer.epoch_start_state is not None
            restore_rng_state(trainer.epoch_start_state["rng"])
            for generator, state in zip(generators, trainer.epoch_start_state["loader_generators"]):
                generator.set_state(state)
        else:
            # The order of an epoch is drawn from these generators when its iterator is created:
            # kept so that a run resumed in the middle of the epoch draws the same order.
            trainer.epoch_start_state = {
                "rng": capture_rng_state(),
                "loader_generators": [generator.get_state() for generator in generators],
            }
        set_epoch(loader, self.progress.epoch)
        iterator: Iterator[Any] = iter(loader)
        if self.num_batches is not None:
            iterator = islice(iterator, self.num_batches)
        for done in range(skip):
            if next(iterator, _EXHAUSTED) is _EXHAUSTED:
                raise ValueError(
                    f"The checkpoint resumes after batch {skip} of epoch {self.progress.epoch}, but the training "
                    f"data has only {done} batches per epoch now; resume with the data it was saved with."
                )
        if self._pending_rng is not None:
            restore_rng_state(self._pending_rng)
            self._pending_rng = None
        return self.feed(iterator)

    def _plan_validation(self, epoch: int) -> None:
        settings = self.settings
        every_n_epochs = settings.check_val_every_n_epoch
        self._validate_this_epoch = self.validation_enabled and (
            every_n_epochs is None or (epoch + 1) % every_n_epochs == 0
        )
        interval = settings.val_check_interval
        if isinstance(interval, float):
            self._validation_interval = None if self.num_batches is None else max(1, int(self.num_batches * interval))
            self._validation_counts_globally = False
        else:
            self._validation_interval = interval
            self._validation_counts_globally = every_n_epochs is None

    def _end_epoch(self) -> None:
        trainer, module, progress = self.trainer, self.module, self.progress
        # Data without a length may end in the middle of an accumulation window.
        self.step_optimizers()
        progress.epoch_finished = True
        logged = self.metrics.finish_epoch("train")
        if self._validate_this_epoch and self._validation_interval is None:
            self._validate()
        step_schedulers(self.scheduler_configs, "epoch", progress.epoch + 1, self.metrics.callback_metrics)
        self.metrics.stage = "train_epoch"
        module.on_train_epoch_end()
        self.hooks.call("on_train_epoch_end", trainer, module)
        logged.update(self.metrics.take_epoch_end_values())
        if logged:
            trainer.log_to_loggers(logged)
        self.metrics.stage = "train_step"
        progress.start_next_epoch_if_finished()

    # -- what a policy builds one item of training data out of (TrainingLoopSteps) ------------------

    def forward_backward(
        self, batch: Any, batch_idx: int, scale_loss: Callable[[torch.Tensor], torch.Tensor] | None
    ) -> tuple[Any, bool]:
        output = self._training_step(batch, batch_idx)
        loss = output if type(output) is torch.Tensor else _loss_of(output)
        self._batch_idx = batch_idx
        if self._checks_loss:
            if not self.checks.loss_is_usable(loss, batch_idx):
                return output, False
        elif loss is None:
            return output, False
        assert loss is not None
        # Kept as returned (a detach per step costs more than the rest of this method); read as a float only.
        self.context.last_loss = loss
        if scale_loss is not None:
            loss = scale_loss(loss)
        if self._hooks_before_backward:
            self.step_hooks.call_before_backward(loss)
        self._backward(loss)
        if self._hooks_after_backward:
            self.step_hooks.call_after_backward()
        if self.at_step_boundary is not None:
            self.at_step_boundary("after_backward")
        self._window_has_grad = True
        return output, True

    def step_optimizers(self) -> None:
        if not self._window_has_grad:
            return
        if self._hooks_before_optimizer_step:
            for optimizer in self.optimizers:
                self.step_hooks.call_before_optimizer_step(optimizer)
        if self.settings.gradient_clip_val is not None and not self._clip_gradients(self.settings.gradient_clip_val):
            for optimizer in self.optimizers:
                self._zero_grad(optimizer)
            self._window_has_grad = False
            return
        step, at_step_boundary = self._step_optimizer, self.at_step_boundary
        for optimizer in self.optimizers:
            step(optimizer)
            if at_step_boundary is not None:
                at_step_boundary("after_optimizer_step")
        zero_grad = self._zero_grad
        for optimizer in self.optimizers:
            zero_grad(optimizer)
        self._window_has_grad = False
        self._count_optimizer_step()

    def _clip_gradients(self, clip_val: float) -> bool:
        """Clip every optimizer's gradients; whether the optimizers may step with them (see
        :meth:`StepChecks.gradient_norm_is_usable`: the norm clipping computed is checked for free)."""
        usable = True
        clip, algorithm = self._clip, self.settings.gradient_clip_algorithm
        for optimizer in self.optimizers:
            norm = clip(optimizer, clip_val, algorithm)
            if self._checks_gradient_norm:
                usable = self.checks.gradient_norm_is_usable(norm, self._batch_idx) and usable
        return usable

    def record_engine_steps(self, output: Any, optimizer_steps: int) -> None:
        loss = _loss_of(output)
        if loss is not None:
            self.context.last_loss = loss.detach()
        for _ in range(optimizer_steps):
            self._count_optimizer_step()

    def manual_training_step(self, batch: Any, batch_idx: int) -> Any:
        assert self.manual is not None
        self.manual.batch_idx = batch_idx
        steps_before = self.progress.global_step
        output = self._training_step(batch, batch_idx)
        loss = _loss_of(output)
        if loss is not None:
            self.context.last_loss = loss.detach()
        every = self.settings.log_every_n_steps
        # Logged once per batch that crossed a logging interval, after training_step logged its values.
        if self.logs_steps and self.progress.global_step // every != steps_before // every:
            self._log_step_metrics()
        return output

    def _count_manual_step(self) -> None:
        self.progress.global_step += 1

    def _count_optimizer_step(self) -> None:
        progress = self.progress
        progress.global_step += 1
        if self.step_schedulers:
            step_schedulers(self.step_schedulers, "step", progress.global_step, self.metrics.callback_metrics)
        if self.logs_steps and progress.global_step % self.settings.log_every_n_steps == 0:
            self._log_step_metrics()

    def _log_step_metrics(self) -> None:
        metrics = self.metrics.step_metrics_for_logger()
        if metrics:
            self.trainer.log_to_loggers(metrics)

    def _validate(self) -> None:
        run_evaluation(
            self.trainer, self.context, self.module, self.val_loaders, "validation", self.settings.limit_val_batches
        )


_EXHAUSTED = object()


def _loss_of(output: Any) -> torch.Tensor | None:
    if output is None or isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping) and "loss" in output:
        loss = output["loss"]
        if isinstance(loss, torch.Tensor):
            return loss
    raise TypeError(
        f"training_step returned {type(output).__name__}; expected the loss (a scalar tensor), a dict with a "
        "'loss' tensor, or None to skip the batch."
    )
