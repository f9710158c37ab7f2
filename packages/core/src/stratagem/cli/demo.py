"""``stratagem demo``: train the built-in model on synthetic data with any strategy, device and precision."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from stratagem.callbacks.callback import Callback
from stratagem.cli.wiring_arguments import add_wiring_arguments, wiring_options

if TYPE_CHECKING:
    from stratagem.module import Module
    from stratagem.trainer import Trainer


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Train a small built-in classifier on synthetic data (generated in memory, nothing is downloaded), "
        "print a model summary, progress, steps/s, samples/s, peak memory and the final loss, and save a "
        "checkpoint. With no options it runs on the CPU "
        "in well under a minute."
    )
    parser.add_argument("--strategy", default="auto", help="a registered strategy name (default: auto)")
    add_wiring_arguments(parser, accelerator="cpu", devices="1")
    parser.add_argument("--max-steps", type=int, default=500, help="optimizer steps to train (default: 500)")
    parser.add_argument("--batch-size", type=int, default=64, help="batch size per device (default: 64)")
    parser.add_argument("--learning-rate", type=float, default=3e-3, help="AdamW learning rate (default: 3e-3)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    parser.add_argument(
        "--root-dir", default="stratagem_demo", help="where logs and checkpoints go (default: ./stratagem_demo)"
    )
    parser.add_argument(
        "--logger", choices=("csv", "tensorboard", "none"), default="csv", help="where metrics go (default: csv)"
    )
    parser.add_argument(
        "--ckpt-path",
        default=None,
        help="resume from a checkpoint path, or 'last' (the newest checkpoint of any run under --root-dir)",
    )
    parser.add_argument("--checkpoint-io", default=None, help="a registered checkpoint IO, e.g. async")


def run(args: argparse.Namespace) -> int:
    from stratagem.callbacks import LearningRateMonitor
    from stratagem.demo import DemoModule, demo_dataloaders
    from stratagem.trainer import Trainer

    try:
        _check_checkpoint_io(args.checkpoint_io)
        options = wiring_options(args)
        options["plugins"] = args.checkpoint_io
        trainer = Trainer(
            strategy=args.strategy,
            **options,
            max_steps=args.max_steps,
            default_root_dir=args.root_dir,
            logger=False if args.logger == "none" else args.logger,
            seed=args.seed,
            # The learning rate beside the loss in the logs (TensorBoard's scalars too).
            callbacks=[_SaySetup()] if args.logger == "none" else [_SaySetup(), LearningRateMonitor()],
        )
    except (ValueError, TypeError, ImportError) as error:  # ImportError: a name whose requirement is missing
        print(f"stratagem demo: {error}", file=sys.stderr)
        return 2
    train_loader, val_loader = demo_dataloaders(batch_size=args.batch_size)
    module = DemoModule(learning_rate=args.learning_rate)
    trainer.fit(module, train_loader, val_loader, ckpt_path=args.ckpt_path)
    if trainer.is_global_zero:
        print(summary(trainer, args.batch_size))
    return 0


def _check_checkpoint_io(name: str | None) -> None:
    # plugins= also takes environment names; --checkpoint-io must name a checkpoint IO.
    from stratagem import registry

    if name is not None and name not in registry.checkpoint_io:
        raise ValueError(f"--checkpoint-io {name!r} is not valid: {registry.checkpoint_io.unknown_name_error(name)}")


class _SaySetup(Callback):
    """Prints once, when training starts, what the options resolved to and where checkpoints go."""

    def on_fit_start(self, trainer: Trainer, module: Module) -> None:
        if trainer.is_global_zero:
            print(setup_line(trainer), flush=True)


def setup_line(trainer: Trainer) -> str:
    """One line: the strategy with its devices, the precision, the number of processes, the checkpoint directory."""
    processes = trainer.world_size
    line = (
        f"stratagem demo: {trainer.strategy!r}, precision {trainer.strategy.precision.name}, "
        f"{processes} process{'es' if processes != 1 else ''}"
    )
    checkpoint = trainer.checkpoint_callback
    if checkpoint is not None and checkpoint.dirpath is not None:
        line += f"; checkpoints go to {checkpoint.dirpath}"
    return line


def summary(trainer: Trainer, batch_size: int) -> str:
    """One line: the final training loss, the last validation metrics, steps/s, samples/s (over all ranks, each
    training on ``batch_size`` samples per step), the largest rank's peak memory and the checkpoint saved."""
    metrics = trainer.callback_metrics
    parts = [f"{name} {float(metrics[name]):.4f}" for name in ("train_loss", "val_loss", "val_acc") if name in metrics]
    throughput = trainer.throughput
    parts.append(f"{throughput.steps_per_second:.1f} steps/s")
    sampler = trainer.strategy.distributed_sampler_kwargs
    replicas = sampler["num_replicas"] if sampler is not None else 1
    parts.append(f"{throughput.steps_per_second * batch_size * replicas:,.0f} samples/s")
    peak = throughput.max_peak_memory_bytes
    if peak is not None:
        parts.append(f"peak memory {peak / 2**20:,.0f} MiB")
    checkpoint = trainer.checkpoint_callback
    if checkpoint is not None and checkpoint.best_model_path:
        parts.append(f"checkpoint {checkpoint.best_model_path}")
    steps = trainer.global_step
    return f"done after {steps} step{'' if steps == 1 else 's'}: " + " | ".join(parts)
