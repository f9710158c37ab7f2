"""Under ddp, fsdp and deepspeed, a step on which the ranks disagree, or whose loss is not finite on one rank, is
caught at that step on every rank alike: named, within seconds, instead of a hang in backward or NaN weights.

One pair of worker processes (ranks as torchrun would start them) runs every strategy and scenario.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional
from torch.utils.data import DataLoader, TensorDataset

import stratagem
from stratagem.testing import DistributedWorkers

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]

WORKER_ENV = {
    "TORCHELASTIC_RUN_ID": "stratagem-step-agreement",
    "GROUP_RANK": "0",
    "OMP_NUM_THREADS": "1",
    "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu"),
}
STRATEGIES = ["ddp", "fsdp", "deepspeed"]
BAD_BATCH = 2
MAX_STEPS = 5


class OddOnRankOne(stratagem.Module):
    """Batch ``BAD_BATCH`` of every epoch gives no loss (``"none"``), a NaN loss (``"nan"``) or a finite loss with a NaN
    gradient (``"nan_gradient"``: d/dw sqrt(|0 * w|) is inf * 0) on rank 1 only."""

    def __init__(self, fault: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        self.fault = fault

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.layers(features)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor | None:
        features, labels = batch
        loss = functional.cross_entropy(self(features), labels)
        if batch_idx != BAD_BATCH or self.global_rank != 1:
            return loss
        if self.fault == "nan_gradient":
            return loss + (self.layers[0].weight * 0).abs().sqrt().sum()
        return None if self.fault == "none" else loss * float("nan")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(64, 8, generator=generator)
    return DataLoader(TensorDataset(features, (features[:, 0] > 0).long()), batch_size=8)


def fit_with_a_fault(
    strategy: str, fault: str, nonfinite: str, root: str, gradient_clip_val: float | None = None
) -> dict[str, Any]:
    """One rank's fit; what it raised (or not), how long it took, its step and whether its weights are finite."""
    module = OddOnRankOne(fault)
    trainer = stratagem.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=2,
        max_steps=MAX_STEPS,
        nonfinite=nonfinite,
        gradient_clip_val=gradient_clip_val,
        default_root_dir=Path(root),
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
    )
    started = time.monotonic()
    error = None
    try:
        trainer.fit(module, _loader())
    except RuntimeError as raised:
        error = str(raised)
    # Each rank holds its shard of a sharded parameter; finite everywhere means finite on every rank.
    finite = all(torch.isfinite(getattr(p, "to_local", lambda p=p: p)()).all() for p in module.parameters())
    return {
        "error": error,
        "seconds": time.monotonic() - started,
        "global_step": trainer.global_step,
        "finite": bool(finite),
    }


@pytest.fixture(scope="module")
def pair():
    with DistributedWorkers(2, env=WORKER_ENV) as workers:
        yield workers


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_batch_without_a_loss_on_one_rank_fails_every_rank_naming_the_ranks_and_the_batch(pair, strategy, tmp_path):
    results = pair.run(fit_with_a_fault, strategy, "none", "error", str(tmp_path), timeout=240)
    for rank, result in enumerate(results):
        assert result["error"] is not None, f"rank {rank} did not fail"
        assert (
            f"The ranks disagree at batch_idx {BAD_BATCH} of epoch 0 (global_step {BAD_BATCH}): training_step "
            f"returned None on rank 1 and a loss on rank 0 (this is rank {rank})" in result["error"]
        )
        assert result["seconds"] < 30
        assert result["finite"]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_nan_loss_on_one_rank_stops_every_rank_before_the_weights_change(pair, strategy, tmp_path):
    results = pair.run(fit_with_a_fault, strategy, "nan", "error", str(tmp_path), timeout=240)
    for result in results:
        assert "non-finite loss" in result["error"]
        assert f"on rank 1 at batch_idx {BAD_BATCH} of epoch 0 (global_step {BAD_BATCH})" in result["error"]
        assert (result["global_step"], result["finite"]) == (BAD_BATCH, True)
    assert "non-finite loss (nan) on rank 1" in results[1]["error"]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_nonfinite_skip_skips_a_nan_batch_on_every_rank_and_trains_on(pair, strategy, tmp_path):
    results = pair.run(fit_with_a_fault, strategy, "nan", "skip", str(tmp_path), timeout=240)
    for result in results:
        assert result["error"] is None
        assert (result["global_step"], result["finite"]) == (MAX_STEPS, True)


# DeepSpeed clips inside its engine step and gives no norm before it: its gradients are not checked.
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_nan_gradient_on_one_rank_stops_every_rank_where_clipping_computes_the_norm(pair, strategy, tmp_path):
    results = pair.run(fit_with_a_fault, strategy, "nan_gradient", "error", str(tmp_path), 100.0, timeout=240)
    for result in results:
        assert f"gradient norm is nan at batch_idx {BAD_BATCH} of epoch 0" in result["error"]
        assert (result["global_step"], result["finite"]) == (BAD_BATCH, True)
