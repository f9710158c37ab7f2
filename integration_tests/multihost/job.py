"""The training script the multi-host tests start on each host, as a user starts theirs on each node.

``python job.py --out DIR --strategy ddp --devices 1 --num-nodes 2 [--ckpt-path last] [--steps N]`` fits a
small regression on a global batch of 16, saving a checkpoint every 2 steps into ``--checkpoints`` (default
``DIR/checkpoints``). Global rank 0 writes ``DIR/result.json`` (steps run, where training started) and the
weights to ``DIR/weights.pt``. ``--die-at-step N --die-marker FILE``: global rank 1 kills itself with SIGKILL at
step N, once (while FILE does not exist). ``--preemption``: a ``Preemption`` callback saves and stops on SIGTERM or
SIGUSR1; ``--step-seconds S`` makes every step last S seconds longer (time to send one). ``--vanish-at-step N
--vanish-marker FILE``: global rank 1 writes FILE and stops itself (SIGSTOP) at step N, for the test to take its
host away. ``--collective-timeout S``: the ddp strategy's collective timeout. ``--save-last``: ModelCheckpoint
also keeps ``last.ckpt``. Every rank writes ``DIR/paths-rank<R>.json``: its ModelCheckpoint's best and last
model paths as that rank reads them, and whether that node sees the best one.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import stratagem
from stratagem.callbacks import ModelCheckpoint

GLOBAL_BATCH = 16


class Regression(stratagem.Module):
    def __init__(
        self,
        die_at_step: int | None = None,
        die_marker: str | None = None,
        step_seconds: float = 0,
        vanish_at_step: int | None = None,
        vanish_marker: str | None = None,
    ) -> None:
        super().__init__()
        self.vanish_at_step = vanish_at_step
        self.vanish_marker = vanish_marker
        self.step_seconds = step_seconds
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
        self.die_at_step = die_at_step
        self.die_marker = die_marker
        self.started_at_step: int | None = None

    def forward(self, x):
        return self.net(x)

    def on_train_start(self) -> None:
        self.started_at_step = self.trainer.global_step

    def training_step(self, batch, batch_idx):
        if (
            self.die_at_step == self.trainer.global_step
            and self.global_rank == 1
            and self.die_marker
            and not Path(self.die_marker).exists()
        ):
            Path(self.die_marker).write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        if self.vanish_at_step == self.trainer.global_step and self.global_rank == 1 and self.vanish_marker:
            Path(self.vanish_marker).write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(self.step_seconds)
        x, y = batch
        return F.mse_loss(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def loader(world_size: int, steps: int) -> DataLoader:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(GLOBAL_BATCH * steps, 4, generator=generator)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(len(x), 1, generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=GLOBAL_BATCH // world_size, shuffle=False)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--checkpoints", default=None)
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--num-nodes", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--ckpt-path", default=None)
    parser.add_argument("--die-at-step", type=int, default=None)
    parser.add_argument("--die-marker", default=None)
    parser.add_argument("--preemption", action="store_true")
    parser.add_argument("--step-seconds", type=float, default=0)
    parser.add_argument("--vanish-at-step", type=int, default=None)
    parser.add_argument("--vanish-marker", default=None)
    parser.add_argument("--collective-timeout", type=float, default=None)
    parser.add_argument("--save-last", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    world_size = args.devices * args.num_nodes
    checkpoints = ModelCheckpoint(
        dirpath=args.checkpoints or out / "checkpoints", every_n_train_steps=2, save_top_k=-1, save_last=args.save_last
    )
    preemption = []
    if args.preemption:
        # Imported when asked: the other scenarios also run on a stratagem without it (checking the old defects).
        from stratagem.callbacks import Preemption

        preemption.append(Preemption())
    strategy = args.strategy
    if args.collective_timeout is not None:
        from stratagem_ddp import DDPStrategy

        strategy = DDPStrategy(timeout=args.collective_timeout)
    trainer = stratagem.Trainer(
        accelerator="cpu",
        strategy=strategy,
        devices=args.devices,
        num_nodes=args.num_nodes,
        max_steps=args.steps,
        default_root_dir=out,
        callbacks=[checkpoints, *preemption],
        enable_progress_bar=False,
        logger=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        seed=0,
    )
    module = Regression(args.die_at_step, args.die_marker, args.step_seconds, args.vanish_at_step, args.vanish_marker)
    trainer.fit(module, loader(world_size, args.steps), ckpt_path=args.ckpt_path)
    paths = {
        "best_model_path": checkpoints.best_model_path,
        "last_model_path": checkpoints.last_model_path,
        "best_exists_here": os.path.exists(checkpoints.best_model_path),
    }
    (out / f"paths-rank{trainer.global_rank}.json").write_text(json.dumps(paths))
    weights = {name: tensor.detach().clone() for name, tensor in module.state_dict().items()}
    if trainer.is_global_zero:
        with (out / "runs.log").open("a") as runs:  # one line per training: duplicates show
            runs.write(f"{os.uname().nodename} {os.getpid()} world size {trainer.world_size}\n")
        torch.save(weights, out / "weights.pt")
        report = {
            "global_step": trainer.global_step,
            "started_at_step": module.started_at_step,
            "world_size": trainer.world_size,
            "hosts": os.uname().nodename,
        }
        (out / "result.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
