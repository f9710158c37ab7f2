"""A small regression job run by the Trainer-level tests, as users run a training script.

``python ddp_job.py --strategy ddp --devices 2 --out DIR --scenarios fit,evaluate`` runs the
named scenarios and writes what they produced into DIR: weights as ``<name>.pt``, everything
else in ``<name>.json``; ``fit`` also calls ``trainer.save_checkpoint(DIR/after_fit.ckpt)`` once
fit has returned. The same functions run in the test process for the single-device
reference. Each run sees the same 16 samples per optimizer step, split across its ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import stratagem
from stratagem.callbacks import ModelCheckpoint

GLOBAL_BATCH = 16
MAX_STEPS = 6
RESUME_AT = 3


class Regression(stratagem.Module):
    def __init__(self, pid_dir: str | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
        self.pid_dir = pid_dir

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        if self.pid_dir is not None and batch_idx == 1:
            Path(self.pid_dir, f"rank-{self.global_rank}.pid").write_text(str(os.getpid()))
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x), y), sync_dist=True)
        self.log("mean_rank", float(self.global_rank), sync_dist=True)

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", F.mse_loss(self(x), y), sync_dist=True)
        self.log("max_rank", float(self.global_rank), sync_dist=True, reduce_fx="max")

    def predict_step(self, batch, batch_idx):
        return self(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def dataset(size: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(size, 4, generator=generator)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(size, 1, generator=generator)
    return TensorDataset(x, y)


def loader(size: int, seed: int, world_size: int) -> DataLoader:
    return DataLoader(dataset(size, seed), batch_size=GLOBAL_BATCH // world_size, shuffle=False)


def make_trainer(args: argparse.Namespace, root: Path, **options) -> stratagem.Trainer:
    return stratagem.Trainer(
        accelerator="cpu",
        strategy=args.strategy,
        devices=args.devices,
        num_nodes=args.num_nodes,
        default_root_dir=root,
        enable_progress_bar=False,
        logger=False,
        num_sanity_val_steps=0,
        seed=0,
        **options,
    )


def run(args: argparse.Namespace) -> None:
    out = Path(args.out)
    world_size = args.devices * args.num_nodes
    train, val = loader(64, 1, world_size), loader(32, 2, world_size)
    for scenario in args.scenarios.split(","):
        report: dict = {}
        if scenario == "fit":
            module = Regression()
            trainer = make_trainer(args, out / "fit", max_steps=MAX_STEPS)
            trainer.fit(module, train, val)
            report = {
                "strategy": args.strategy,
                "global_step": trainer.global_step,
                "callback_metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
                "checkpoint": str(trainer.checkpoint_callback.best_model_path),
                "save_after_fit": save_after_fit(trainer, out / "after_fit.ckpt"),
            }
        elif scenario == "evaluate":
            module = Regression()
            trainer = make_trainer(args, out / "evaluate")
            report["validate"] = trainer.validate(module, val)
            report["test"] = trainer.test(module, val)
            report["predictions"] = torch.cat(trainer.predict(module, val)).flatten().tolist()
        elif scenario == "load":
            trainer = make_trainer(args, out / "load")
            report["validate"] = trainer.validate(Regression(), val, ckpt_path=args.load)
        elif scenario == "resume":
            every = ModelCheckpoint(dirpath=out / "resume" / "checkpoints", every_n_train_steps=RESUME_AT)
            make_trainer(args, out / "resume", max_steps=RESUME_AT, callbacks=[every]).fit(Regression(), train, val)
            module = Regression()
            trainer = make_trainer(args, out / "resume", max_steps=MAX_STEPS)
            trainer.fit(module, train, val, ckpt_path=every.best_model_path)
            report = {"resumed_from": str(every.best_model_path), "global_step": trainer.global_step}
        elif scenario == "endless":
            trainer = make_trainer(args, out / "endless", max_steps=1_000_000, val_check_interval=10_000)
            started = time.monotonic()
            trainer.fit(Regression(pid_dir=str(out)), train)
            report = {"seconds": time.monotonic() - started}
        else:
            raise ValueError(f"unknown scenario {scenario!r}")
        if trainer.is_global_zero:
            if scenario in ("fit", "resume"):
                torch.save(module.state_dict(), out / f"{scenario}.pt")
            (out / f"{scenario}.json").write_text(json.dumps(report, default=str))


def save_after_fit(trainer: stratagem.Trainer, path: Path) -> str | None:
    """``trainer.save_checkpoint(path)`` once fit has returned, as a user's script calls it on every rank; what it
    raised, or ``None``."""
    try:
        trainer.save_checkpoint(path)
    except RuntimeError as error:
        return str(error)
    return None


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--out", required=True)
    parser.add_argument("--scenarios", default="fit")
    parser.add_argument("--load", default=None, help="checkpoint for the 'load' scenario")
    return parser.parse_args(argv)


if __name__ == "__main__":
    run(parse())
