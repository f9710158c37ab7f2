"""A small classifier and its data, shared by the HPU tests and by ``hpu_job.py``."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import stratagem


def make_loader(num_samples: int = 64, batch_size: int = 8) -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(num_samples, 8, generator=generator)
    labels = (features.sum(dim=1) > 0).long()
    return DataLoader(TensorDataset(features, labels), batch_size=batch_size)


class Classifier(stratagem.Module):
    """Logs three metrics per training step and two per evaluation step, each with ``sync_dist=True``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        self.seen_autocast: list[tuple[bool, torch.dtype]] = []
        self.reductions: dict[str, Any] = {}

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.layers(features)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        features, labels = batch
        self.seen_autocast.append((torch.is_autocast_enabled("hpu"), torch.get_autocast_dtype("hpu")))
        logits = self(features)
        loss = F.cross_entropy(logits.float(), labels)
        self.log("train_loss", loss, sync_dist=True)
        self.log("train_acc", (logits.argmax(1) == labels).float().mean(), sync_dist=True)
        self.log("rank", float(self.global_rank), sync_dist=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        features, labels = batch
        self.log("val_loss", F.cross_entropy(self(features).float(), labels), sync_dist=True)
        self.log("val_rank", float(self.global_rank), sync_dist=True)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        features, labels = batch
        self.log("test_loss", F.cross_entropy(self(features).float(), labels), sync_dist=True)

    def on_test_epoch_end(self) -> None:
        # HCCL reduces no integer tensors and has no mean: the strategy must make both work.
        strategy = self.trainer.strategy
        rank = self.global_rank
        for op in ("mean", "sum", "max"):
            for kind, value in (
                ("int", torch.tensor([rank + 1, 10 * (rank + 1)])),
                ("float", torch.tensor(rank + 1.5)),
            ):
                reduced = strategy.reduce(value, op)
                self.reductions[f"{kind}_{op}"] = {"value": reduced.tolist(), "dtype": str(reduced.dtype)}

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(batch[0]).argmax(1)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def trainer(root: Any, **options: Any) -> stratagem.Trainer:
    settings: dict[str, Any] = {
        "accelerator": "hpu",
        "devices": 1,
        "strategy": "hpu_single",
        "max_epochs": 1,
        "enable_progress_bar": False,
        "enable_checkpointing": False,
        "logger": False,
        "num_sanity_val_steps": 0,
        "default_root_dir": root,
    }
    settings.update(options)
    return stratagem.Trainer(**settings)
