"""The demo's model: a small classifier, built in ``configure_model`` so any strategy can place it."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional

from stratagem.demo.data import NUM_CLASSES, NUM_FEATURES
from stratagem.module import Module


class DemoModule(Module):
    """A multi-layer perceptron on the synthetic data, trained with AdamW and a cosine schedule per step."""

    def __init__(self, hidden: int = 128, learning_rate: float = 3e-3) -> None:
        super().__init__()
        self.hidden = hidden
        self.learning_rate = learning_rate
        self.net: nn.Module | None = None

    def configure_model(self) -> None:
        if self.net is None:
            self.net = nn.Sequential(
                nn.Linear(NUM_FEATURES, self.hidden),
                nn.GELU(),
                nn.Linear(self.hidden, self.hidden),
                nn.GELU(),
                nn.Linear(self.hidden, NUM_CLASSES),
            )

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        assert self.net is not None, "configure_model() creates the layers"
        return self.net(features)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        features, labels = batch
        loss = functional.cross_entropy(self(features), labels)
        self.log("train_loss", loss)  # the progress bar shows the loss already
        return loss

    def validation_step(self, batch: Any, batch_idx: int, *args: Any) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: Any, batch_idx: int, *args: Any) -> None:
        self._evaluate(batch, "test")

    def predict_step(self, batch: Any, batch_idx: int, *args: Any) -> torch.Tensor:
        features = batch[0] if isinstance(batch, list | tuple) else batch
        return self(features).argmax(dim=1)

    def _evaluate(self, batch: Any, prefix: str) -> None:
        features, labels = batch
        logits = self(features)
        accuracy = (logits.argmax(dim=1) == labels).float().mean()
        self.log(f"{prefix}_loss", functional.cross_entropy(logits.float(), labels), prog_bar=True, sync_dist=True)
        self.log(f"{prefix}_acc", accuracy, prog_bar=True, sync_dist=True)

    def configure_optimizers(self) -> Any:
        # AdamW's default eps (1e-8) rounds to 0 in float16, where 16-true keeps the optimizer state.
        dtype = next(self.parameters()).dtype
        eps = max(1e-8, torch.finfo(dtype).tiny)
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.learning_rate, weight_decay=0.01, eps=eps)
        total_steps = self.trainer.max_steps if self.trainer.max_steps > 0 else 1000
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
