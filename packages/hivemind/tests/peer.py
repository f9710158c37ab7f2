"""One swarm peer for the tests: ``python peer.py OUT_DIR OPTIONS_JSON [--steps N] [--data-seed S] [--step-delay T]``.

Trains a small regression model with ``HivemindStrategy(**OPTIONS)`` for ``--steps`` local steps and
writes into OUT_DIR: ``epochs.pt`` (the weights at every collaborative epoch this peer reached),
``result.json`` (epochs at start and end, the most peers seen, the checkpoint) once it finished,
and ``progress.json`` after every step, so that a test can watch a peer it will kill.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional
from torch.utils.data import DataLoader, TensorDataset

from stratagem import Module, Trainer
from stratagem.callbacks import Callback
from stratagem_hivemind import HivemindStrategy

FEATURES = 8
BATCH_SIZE = 16


class Regression(Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        features, targets = batch
        loss = functional.mse_loss(self(features), targets)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        features, targets = batch
        self.log("val_loss", functional.mse_loss(self(features), targets))

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def make_loader(seed: int, batches: int) -> DataLoader:
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(BATCH_SIZE * batches, FEATURES, generator=generator)
    targets = features.sum(dim=1, keepdim=True).sin()
    return DataLoader(TensorDataset(features, targets), batch_size=BATCH_SIZE)


class RecordSwarm(Callback):
    """Records the weights at each collaborative epoch, the epochs and the peers this peer saw."""

    def __init__(self, out: Path, step_delay: float) -> None:
        self.out = out
        self.step_delay = step_delay
        self.epochs: dict[int, dict[str, torch.Tensor]] = {}
        self.record: dict[str, Any] = {"epoch_at_start": None, "max_peers": 0, "learning_rates": {}}

    def _observe(self, trainer: Trainer, module: Module) -> None:
        swarm = trainer.strategy.swarm
        epoch = swarm.epoch
        if epoch not in self.epochs:
            self.epochs[epoch] = {key: value.detach().clone() for key, value in module.state_dict().items()}
            self.record["learning_rates"][epoch] = trainer.optimizers[0].param_groups[0]["lr"]
        self.record["max_peers"] = max(self.record["max_peers"], swarm.peers)
        self.record["epoch"] = epoch

    def on_train_start(self, trainer: Trainer, module: Module) -> None:
        self.record["epoch_at_start"] = trainer.strategy.swarm.epoch
        self._observe(trainer, module)

    def on_train_batch_end(self, trainer: Trainer, module: Module, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._observe(trainer, module)
        self.record["global_step"] = trainer.global_step
        _write_json(self.out / "progress.json", self.record)
        time.sleep(self.step_delay)

    def on_train_end(self, trainer: Trainer, module: Module) -> None:
        self.record["epoch_at_end"] = trainer.strategy.swarm.epoch
        torch.save(self.epochs, self.out / "epochs.pt")


def _write_json(path: Path, value: Any) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(value))
    temporary.replace(path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("options", type=json.loads)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--step-delay", type=float, default=0.0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    recorder = RecordSwarm(args.out, args.step_delay)
    trainer = Trainer(
        strategy=HivemindStrategy(**args.options),
        accelerator="cpu",
        devices=1,
        max_steps=args.steps,
        default_root_dir=args.out,
        logger=False,
        enable_progress_bar=False,
        num_sanity_val_steps=0,
        callbacks=[recorder],
        seed=args.data_seed,
    )
    trainer.fit(Regression(), make_loader(args.data_seed, args.steps))
    checkpoint = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else None
    _write_json(args.out / "result.json", {**recorder.record, "checkpoint": checkpoint})


if __name__ == "__main__":
    main()
