"""The training script of the elastic torchrun tests, run by torchrun as users run theirs.

``torchrun ... elastic_job.py --out DIR [--fail-at-step N]`` fits ``ddp_job.Regression`` under
``strategy="ddp"``, resuming from the last checkpoint when there is one. Every rank writes what it
saw to ``DIR/rank-<RANK>-attempt-<TORCHELASTIC_RESTART_COUNT>.json`` and its weights beside it;
each checkpoint save is logged by the process that wrote it. With ``--fail-at-step N`` rank 1
raises at step N of torchrun's first attempt, leaving a ``.failed`` file.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import ddp_job
import torch
import torch.distributed as dist

import stratagem
from stratagem.callbacks import ModelCheckpoint
from stratagem.checkpoint_io import TorchCheckpointIO

CHECKPOINT_EVERY = 2


def _attempt() -> str:
    return f"rank-{os.environ['RANK']}-attempt-{os.environ['TORCHELASTIC_RESTART_COUNT']}"


class SaveLoggingCheckpointIO(TorchCheckpointIO):
    def __init__(self, out: Path) -> None:
        super().__init__()
        self.log = out / f"{_attempt()}.saves"

    def save_checkpoint(self, checkpoint, path) -> None:
        super().save_checkpoint(checkpoint, path)
        with self.log.open("a") as log:
            log.write(f"{Path(path).name}\n")


class CountedRegression(ddp_job.Regression):
    def __init__(self, out: Path, fail_at_step: int | None) -> None:
        super().__init__()
        self.out = out
        self.fail_at_step = fail_at_step
        self.steps_run = 0
        self.started_at_step: int | None = None
        self.process_group_size: int | None = None

    def on_train_start(self) -> None:
        self.started_at_step = self.trainer.global_step
        self.process_group_size = dist.get_world_size()

    def training_step(self, batch, batch_idx):
        first_attempt = os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
        if first_attempt and self.global_rank == 1 and self.trainer.global_step == self.fail_at_step:
            (self.out / f"{_attempt()}.failed").write_text(str(self.fail_at_step))
            raise RuntimeError(f"rank 1 fails at step {self.fail_at_step} on purpose")
        self.steps_run += 1
        return super().training_step(batch, batch_idx)


def run(args: argparse.Namespace) -> None:
    out = Path(args.out)
    # Read before the Trainer exists: what torchrun gave this attempt.
    given = {name: os.environ[name] for name in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")}
    checkpoints = ModelCheckpoint(dirpath=out / "checkpoints", every_n_train_steps=CHECKPOINT_EVERY, save_top_k=-1)
    trainer = stratagem.Trainer(
        accelerator="cpu",
        strategy="ddp",
        devices=2,
        max_steps=ddp_job.MAX_STEPS,
        default_root_dir=out,
        callbacks=[checkpoints],
        plugins=[SaveLoggingCheckpointIO(out)],
        enable_progress_bar=False,
        logger=False,
        num_sanity_val_steps=0,
        seed=0,
    )
    module = CountedRegression(out, args.fail_at_step)
    world_size = 2
    trainer.fit(module, ddp_job.loader(64, 1, world_size), ddp_job.loader(32, 2, world_size), ckpt_path="last")
    environment = trainer.strategy.cluster_environment
    report = {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "given": given,
        "seen": {
            "MASTER_ADDR": environment.main_address,
            "MASTER_PORT": str(environment.main_port),
            "TORCHELASTIC_RUN_ID": environment.run_id,
        },
        "environment": type(environment).__name__,
        "global_rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "process_group_size": module.process_group_size,
        "started_at_step": module.started_at_step,
        "steps_run": module.steps_run,
        "global_step": trainer.global_step,
    }
    (out / f"{_attempt()}.json").write_text(json.dumps(report, default=str))
    torch.save(module.state_dict(), out / f"{_attempt()}.pt")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--fail-at-step", type=int, default=None)
    run(parser.parse_args())
