"""A training script, run as users run one: ``python horovod_job.py --strategy horovod --out DIR [options]``.

Fits a small regression model on 2 CPU processes, 16 samples per optimizer step split across the ranks,
and writes every rank's final weights to ``DIR/rank-<R>.pt``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import stratagem

GLOBAL_BATCH = 16
MAX_STEPS = 6


class Regression(stratagem.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self(x), y)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--clip", type=float, default=None)
    parser.add_argument("--compression", default=None)
    args = parser.parse_args()
    devices = 2
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(128, 4, generator=generator)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(128, 1, generator=generator)
    micro_batch = GLOBAL_BATCH // devices // args.accumulate
    train = DataLoader(TensorDataset(x, y), batch_size=micro_batch, shuffle=False)
    strategy = args.strategy
    if args.compression is not None:
        from stratagem_horovod import HorovodStrategy

        strategy = HorovodStrategy(compression=args.compression)
    trainer = stratagem.Trainer(
        accelerator="cpu",
        strategy=strategy,
        devices=devices,
        max_steps=MAX_STEPS,
        accumulate_grad_batches=args.accumulate,
        gradient_clip_val=args.clip,
        default_root_dir=Path(args.out, "run"),
        enable_progress_bar=False,
        enable_checkpointing=False,
        logger=False,
        seed=0,
    )
    module = Regression()
    trainer.fit(module, train)
    state = {key: value.detach().cpu() for key, value in trainer.strategy.module.state_dict().items()}
    torch.save(state, Path(args.out, f"rank-{trainer.global_rank}.pt"))


if __name__ == "__main__":
    main()
