"""A small deterministic regression model and its data, shared by the xla tests."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional
from torch.utils.data import DataLoader, TensorDataset

from stratagem import Module

FEATURES = 6


class Regression(Module):
    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, 1))
        self.lr = lr
        self.batch_devices: list[str] = []

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        features, targets = batch
        self.batch_devices.append(features.device.type)
        loss = functional.mse_loss(self(features).float(), targets.float())
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        features, targets = batch
        self.log("val_loss", functional.mse_loss(self(features).float(), targets.float()))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        features, targets = batch
        self.log("test_loss", functional.mse_loss(self(features).float(), targets.float()))

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        features, _ = batch
        return self(features)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def data(samples: int = 64, seed: int = 1) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(samples, FEATURES, generator=generator)
    targets = features.sum(dim=1, keepdim=True).sin()
    return TensorDataset(features, targets)


def loader(shuffle: bool = False, batch_size: int = 8) -> DataLoader:
    return DataLoader(data(), batch_size=batch_size, shuffle=shuffle)


def weights(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().cpu().float() for name, value in module.state_dict().items()}
