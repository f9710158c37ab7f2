"""Trainer-level runs, started by the tests as ``python deepspeed_trainer_script.py ...``.

The strategy's launcher re-runs this file for the other ranks, as it would a user's script.
Rank 0 writes the weights the strategy holds at the end of training or validation (gathered
live, independently of any checkpoint) to ``<root>/live_weights.pt``, and validation results
to ``<root>/results.json``. ``--then validate resume`` runs more Trainers in the same processes
after the first, as a script that evaluates and resumes its own checkpoint does; each writes
``<root>/live_weights_after_<run>.pt``. ``--save-at-train-end`` saves ``<root>/train_end.ckpt``
from ``on_train_end`` of the first run; ``--save-after-fit`` calls
``trainer.save_checkpoint(<root>/after_fit.ckpt)`` on every rank once its ``fit`` has returned, and
writes what it raised to ``<root>/after_fit_rank<r>.error``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from stratagem import Trainer
from stratagem.callbacks.callback import Callback
from stratagem.demo import DemoModule, demo_dataloaders


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
    parser.add_argument("--strategy", default="deepspeed_stage_3")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--validate", action="store_true", help="validate --ckpt-path instead of fitting")
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--max-steps", type=int, default=12)
    parser.add_argument("--stop-after", type=int, default=None)
    parser.add_argument("--ckpt-path", default=None)
    parser.add_argument(
        "--then",
        nargs="+",
        default=[],
        choices=("validate", "resume"),
        help="after the first run, each by a new Trainer: validate its checkpoint, or fit on from it to --max-steps",
    )
    parser.add_argument("--save-at-train-end", action="store_true")
    parser.add_argument("--save-after-fit", action="store_true")
    args = parser.parse_args()
    args.root.mkdir(parents=True, exist_ok=True)

    train_end = [SaveAtTrainEnd(args.root / "train_end.ckpt")] if args.save_at_train_end else []
    kind = "validate" if args.validate else "fit"
    trainer = run(args, kind, args.ckpt_path, args.root / "live_weights.pt", train_end)
    if args.save_after_fit:
        save_after_fit(trainer, args.root)
    if args.then:
        assert trainer.checkpoint_callback is not None
        checkpoint = trainer.checkpoint_callback.best_model_path
        for then in args.then:
            run(args, then, checkpoint, args.root / f"live_weights_after_{then}.pt")


def run(
    args: argparse.Namespace, kind: str, ckpt_path: str | None, weights: Path, extra: list[Callback] | None = None
) -> Trainer:
    """One Trainer's ``fit`` (``"fit"``, or ``"resume"`` without --stop-after) or ``validate``."""
    callbacks: list[Callback] = [SaveLiveWeights(weights), *(extra or [])]
    if args.stop_after is not None and kind == "fit":
        callbacks.append(StopAfter(args.stop_after))
    trainer = Trainer(
        strategy=args.strategy,
        accelerator="cpu",
        devices=args.devices,
        precision=args.precision,
        max_steps=args.max_steps,
        default_root_dir=args.root,
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        num_sanity_val_steps=0,
        seed=0,
    )
    train_loader, val_loader = demo_dataloaders(batch_size=16, num_samples=512)
    if kind == "validate":
        results = trainer.validate(DemoModule(hidden=32), val_loader, ckpt_path=ckpt_path)
        if trainer.is_global_zero:
            (args.root / "results.json").write_text(json.dumps(results))
    else:
        trainer.fit(DemoModule(hidden=32), train_loader, val_loader, ckpt_path=ckpt_path)
    return trainer


if __name__ == "__main__":
    main()
