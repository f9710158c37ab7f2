"""Small models, data and Trainer settings shared by the Trainer tests."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional
from torch.utils.data import DataLoader, TensorDataset

import stratagem


def make_dataset(num_samples: int = 64, num_features: int = 8, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(num_samples, num_features, generator=generator)
    labels = (features[:, 0] + features[:, 1] > 0).long()
    return TensorDataset(features, labels)


def make_loader(num_samples: int = 64, batch_size: int = 8, shuffle: bool = False, seed: int = 0) -> DataLoader:
    return DataLoader(make_dataset(num_samples, seed=seed), batch_size=batch_size, shuffle=shuffle)


class ClassifierModule(stratagem.Module):
    """Two linear layers (with optional dropout, for RNG-dependent training), cross-entropy, SGD or Adam."""

    def __init__(self, dropout: float = 0.0, optimizer: str = "sgd", lr: float = 0.1, scheduler: Any = None) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(dropout), nn.Linear(16, 2))
        self.optimizer_name = optimizer
        self.lr = lr
        self.scheduler = scheduler

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.layers(features)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        features, labels = batch
        loss = functional.cross_entropy(self(features), labels)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int, *args: Any) -> None:
        features, labels = batch
        logits = self(features)
        self.log("val_loss", functional.cross_entropy(logits.float(), labels))
        self.log("val_acc", (logits.argmax(1) == labels).float().mean())

    def test_step(self, batch: Any, batch_idx: int, *args: Any) -> None:
        features, labels = batch
        self.log("test_loss", functional.cross_entropy(self(features).float(), labels))

    def predict_step(self, batch: Any, batch_idx: int, *args: Any) -> torch.Tensor:
        return self(batch[0]).argmax(1)

    def configure_optimizers(self) -> Any:
        if self.optimizer_name == "adam":
            optimizer: torch.optim.Optimizer = torch.optim.Adam(self.parameters(), lr=self.lr)
        else:
            optimizer = torch.optim.SGD(self.parameters(), lr=self.lr)
        if self.scheduler is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": self.scheduler(optimizer)}


def quiet_trainer(root: Any, **options: Any) -> stratagem.Trainer:
    """A CPU Trainer that prints nothing, logs nothing and saves nothing unless asked."""
    settings: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 1,
        "enable_progress_bar": False,
        "enable_checkpointing": False,
        "enable_model_summary": False,
        "logger": False,
        "num_sanity_val_steps": 0,
        "default_root_dir": root,
    }
    settings.update(options)
    return stratagem.Trainer(**settings)


def parameters_of(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in module.state_dict().items()}


def assert_bitwise_equal(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> None:
    assert first.keys() == second.keys()
    different = [name for name in first if not torch.equal(first[name], second[name])]
    assert not different, f"differ bitwise: {different}"
