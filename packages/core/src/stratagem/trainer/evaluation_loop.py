"""Validation and test passes: run the step on every batch, aggregate what was logged per dataloader."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal

import torch

from stratagem.trainer.data import count_batches, limited
from stratagem.trainer.rng import isolated_rng

if TYPE_CHECKING:
    from stratagem.module import Module
    from stratagem.trainer.run_context import RunContext
    from stratagem.trainer.trainer import Trainer

EvaluationKind = Literal["validation", "test"]


def run_evaluation(
    trainer: Trainer,
    context: RunContext,
    module: Module,
    loaders: list[Iterable[Any]],
    kind: EvaluationKind,
    limit: int | float,
    max_batches: int | None = None,
) -> list[dict[str, float]]:
    """One pass over ``loaders``; returns one dict of epoch metrics per dataloader, the same on every rank.

    Runs without gradients and without moving the global random generators, so that training
    continues the same whether or not evaluation ran. ``max_batches`` caps every dataloader
    (the sanity check).
    """
    runtime = trainer.runtime
    at_step_boundary = runtime.step_boundary
    metrics = context.metrics
    hooks = context.hooks
    step_name = f"{kind}_step"
    calls = runtime.step_calls(step_name)
    to_device, run_step = calls.batch_to_device, calls.run_step
    argument = f"limit_{'val' if kind == 'validation' else 'test'}_batches"
    was_training = module.training
    previous_stage = metrics.stage
    module.eval()
    hooks.call(f"on_{kind}_start", trainer, module)
    results: list[dict[str, float]] = []
    with isolated_rng(), torch.no_grad():
        metrics.stage = "evaluation"
        getattr(module, f"on_{kind}_epoch_start")()
        batch_end_hooks = hooks.overriding(f"on_{kind}_batch_end")
        feed = runtime.batch_feed
        several = len(loaders) > 1
        for dataloader_idx, loader in enumerate(loaders):
            metrics.suffix = f"/dataloader_idx_{dataloader_idx}" if several else ""
            count = count_batches(loader, limit, argument)
            if max_batches is not None:
                count = max_batches if count is None else min(count, max_batches)
            for batch_idx, batch in enumerate(feed(limited(loader, count))):
                metrics.batch = batch
                batch = to_device(batch)
                arguments = (batch, batch_idx, dataloader_idx) if several else (batch, batch_idx)
                if at_step_boundary is not None:
                    at_step_boundary("before_evaluation_step")
                output = run_step(*arguments)
                for hook in batch_end_hooks:
                    hook(trainer, module, output, batch, batch_idx, dataloader_idx)
            results.append(metrics.finish_epoch("evaluation"))
        metrics.suffix = ""
        getattr(module, f"on_{kind}_epoch_end")()
        shared = metrics.finish_epoch("evaluation")
        for result in results:
            result.update(shared)
        metrics.batch = None
    results = runtime.broadcast(results)
    merged = {name: value for result in results for name, value in result.items()}
    trainer.last_evaluation_metrics = merged
    if merged and trainer.is_global_zero and not trainer.sanity_checking:
        trainer.log_to_loggers(merged)
    hooks.call(f"on_{kind}_end", trainer, module)
    module.train(was_training)
    metrics.stage = previous_stage
    return results
