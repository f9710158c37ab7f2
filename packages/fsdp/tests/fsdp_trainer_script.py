"""Trainer-level runs, started by the tests as ``python fsdp_trainer_script.py ...``.

The strategy's launcher re-runs this file for the other ranks, as it would a user's script.
Rank 0 writes the weights the strategy holds at the end of training or validation (gathered
live, independently of any checkpoint) to ``<root>/live_weights.pt``, and validation results
to ``<root>/results.json``. ``--save-at-train-end`` saves ``<root>/train_end.ckpt`` from
``on_train_end``; ``--save-after-fit`` calls ``trainer.save_checkpoint(<root>/after_fit.ckpt)``
on every rank once ``fit`` has returned, and writes what it raised to ``<root>/after_fit_rank<r>.error``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from stratagem import Trainer
from stratagem.callbacks.callback import Callback
from stratagem.callbacks.model_checkpoint import ModelCheckpoint
from stratagem.demo import DemoModule, demo_dataloaders
from stratagem_fsdp import FSDPStrategy

HIDDEN = 32


class StopAfter(Callback):
    """Stops fitting after ``steps`` optimizer steps, as an interrupted run would."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def on_train_batch_end(self, trainer: Trainer, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step >= self.steps:
            trainer.should_stop = True


class SaveLiveWeights(Callback):
    def __init__(self, path: Path) -> None:
        self.path = path

    def on_train_end(self, trainer: Trainer, module: Any) -> None:
        self._save(trainer)

    def on_validation_end(self, trainer: Trainer, module: Any) -> None:
        if trainer.stage == "validate":
            self._save(trainer)

    def _save(self, trainer: Trainer) -> None:
        weights = trainer.strategy.module_full_state_dict()
        if trainer.is_global_zero:
            torch.save(weights, self.path)


class SaveAtTrainEnd(Callback):
    def __init__(self, path: Path) -> None:
        self.path = path

    def on_train_end(self, trainer: Trainer, module: Any) -> None:
        trainer.save_checkpoint(self.path)


def save_after_fit(trainer: Trainer, root: Path) -> None:
    try:
        trainer.save_checkpoint(root / "after_fit.ckpt")
    except RuntimeError as error:
        (root / f"after_fit_rank{trainer.global_rank}.error").write_text(str(error))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="fsdp")
    parser.add_argument("--state-dict-type", default=None, help="with --strategy fsdp: 'sharded' or 'full'")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--validate", action="store_true", help="validate --ckpt-path instead of fitting")
    parser.add_argument("--validate-after-fit", action="store_true", help="fit, then validate the same module")
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--max-steps", type=int, default=12)
    parser.add_argument("--stop-after", type=int, default=None)
    parser.add_argument("--ckpt-path", default=None)
    parser.add_argument("--save-at-train-end", action="store_true")
    parser.add_argument("--save-after-fit", action="store_true")
    parser.add_argument("--plugins", default=None, help="the Trainer's plugins= (a checkpoint IO name)")
    parser.add_argument("--checkpoint-every", type=int, default=None, help="keep the latest of a save every N steps")
    args = parser.parse_args()
    args.root.mkdir(parents=True, exist_ok=True)

    strategy: Any = args.strategy
    if args.state_dict_type is not None:
        strategy = FSDPStrategy(state_dict_type=args.state_dict_type)
    callbacks: list[Callback] = [SaveLiveWeights(args.root / "live_weights.pt")]
    if args.stop_after is not None:
        callbacks.append(StopAfter(args.stop_after))
    if args.save_at_train_end:
        callbacks.append(SaveAtTrainEnd(args.root / "train_end.ckpt"))
    if args.checkpoint_every is not None:
        callbacks.append(ModelCheckpoint(every_n_train_steps=args.checkpoint_every, save_top_k=1))
    trainer = Trainer(
        strategy=strategy,
        plugins=args.plugins,
        accelerator="cpu",
        devices=args.devices,
        max_steps=args.max_steps,
        default_root_dir=args.root,
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        num_sanity_val_steps=0,
        seed=0,
    )
    train_loader, val_loader = demo_dataloaders(batch_size=16, num_samples=512)
    module = DemoModule(hidden=HIDDEN)
    if not args.validate:
        trainer.fit(module, train_loader, val_loader, ckpt_path=args.ckpt_path)
    if args.save_after_fit:
        save_after_fit(trainer, args.root)
    if args.validate or args.validate_after_fit:
        results = trainer.validate(module, val_loader, ckpt_path=args.ckpt_path if args.validate else None)
        if trainer.is_global_zero:
            (args.root / "results.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
