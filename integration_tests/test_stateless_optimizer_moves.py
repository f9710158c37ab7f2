"""A checkpoint whose optimizer keeps no per-parameter state (SGD without momentum), saved by deepspeed_stage_3
on 2 ranks, resumes under fsdp on 2 ranks and trains on (it failed with torch's 'Expected device to be set')."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from matrix_runs import MatrixModule, loader

import stratagem
from stratagem.callbacks import ModelCheckpoint
from stratagem.testing import DistributedWorkers

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]

WORKER_ENV = {
    "TORCHELASTIC_RUN_ID": "stratagem-stateless-optimizer",
    "GROUP_RANK": "0",
    "OMP_NUM_THREADS": "1",
    "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu"),
}


class StatelessOptimizerModule(MatrixModule):
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def fit(strategy: str, root: str, max_steps: int, ckpt_path: str | None) -> dict:
    checkpoint = ModelCheckpoint(dirpath=Path(root) / "checkpoints", filename="final")
    trainer = stratagem.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=2,
        default_root_dir=root,
        logger=False,
        enable_progress_bar=False,
        num_sanity_val_steps=0,
        max_steps=max_steps,
        callbacks=[checkpoint],
    )
    trainer.fit(StatelessOptimizerModule(), loader(0), ckpt_path=ckpt_path)
    return {"global_step": trainer.global_step, "checkpoint": checkpoint.last_model_path or checkpoint.best_model_path}


def test_a_deepspeed_stage_3_checkpoint_of_sgd_without_momentum_resumes_under_fsdp(tmp_path):
    with DistributedWorkers(2, env=WORKER_ENV) as workers:
        saved = workers.run(fit, "deepspeed_stage_3", str(tmp_path / "deepspeed"), 2, None, timeout=240)[0]
        resumed = workers.run(fit, "fsdp", str(tmp_path / "fsdp"), 4, saved["checkpoint"], timeout=240)
    assert saved["global_step"] == 2
    assert [result["global_step"] for result in resumed] == [4, 4]
