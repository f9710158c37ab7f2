"""The strategies on CUDA GPUs (NCCL between processes): ddp, fsdp, model_parallel and DeepSpeed stages 2 and 3
on as many processes as there are GPUs (two at most, one on a machine with one GPU), and dp in one process, each
training as single_device does on the GPU from the same global batches."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional
from torch.utils.data import DataLoader, TensorDataset

import stratagem
from stratagem.callbacks import Callback
from stratagem.testing import DistributedWorkers, cuda_device_count, requires_cuda

pytestmark = [*requires_cuda(), pytest.mark.distributed, pytest.mark.timeout(300)]

GLOBAL_BATCH = 8
STEPS = 6
WORLD = max(1, min(2, cuda_device_count()))
WORKER_ENV = {"TORCHELASTIC_RUN_ID": "stratagem-cuda", "GROUP_RANK": "0", "OMP_NUM_THREADS": "1"}
DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
NEEDS_DEEPSPEED = pytest.mark.skipif(not DEEPSPEED, reason="deepspeed is not installed here")


class Regression(stratagem.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        inputs, targets = batch
        return functional.mse_loss(self.net(inputs), targets)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


class RecordLosses(Callback):
    """Each step's loss as the loop got it (under dp: the mean of the replicas' losses)."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.losses.append(float(outputs.detach()))


def _loader(replicas: int) -> DataLoader:
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(STEPS * GLOBAL_BATCH, 4, generator=generator)
    return DataLoader(TensorDataset(inputs, inputs.sum(dim=1, keepdim=True).sin()), batch_size=GLOBAL_BATCH // replicas)


def fit_on_cuda(strategy: str, devices: int, root: str) -> dict[str, Any]:
    """One fit on ``devices`` GPUs: this rank's loss per step, the process group's backend, each rank's peak."""
    trainer = stratagem.Trainer(
        accelerator="cuda",
        strategy=strategy,
        devices=devices,
        max_steps=STEPS,
        seed=0,
        default_root_dir=Path(root),
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[losses := RecordLosses()],
    )
    module = Regression()
    # The ranks that split the data (not model_parallel's tensor-parallel ranks, which share each batch).
    sampler = trainer.strategy.distributed_sampler_kwargs
    trainer.fit(module, _loader(sampler["num_replicas"] if sampler is not None else 1))
    return {
        "losses": losses.losses,
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "device": trainer.strategy.root_device.type,
        "peak_memory_bytes": trainer.throughput.peak_memory_bytes,
    }


@pytest.fixture(scope="module")
def single_device(tmp_path_factory):
    return fit_on_cuda("single_device", 1, str(tmp_path_factory.mktemp("single_device")))


@pytest.fixture(scope="module")
def gpus():
    with DistributedWorkers(WORLD, backend="nccl", env=WORKER_ENV) as workers:
        yield workers


@pytest.mark.parametrize(
    "strategy",
    [
        "ddp",
        "fsdp",
        "model_parallel",
        pytest.param("deepspeed_stage_2", marks=NEEDS_DEEPSPEED),
        pytest.param("deepspeed_stage_3", marks=NEEDS_DEEPSPEED),
    ],
)
def test_each_strategy_trains_on_cuda_with_nccl_as_single_device_does(gpus, single_device, strategy, tmp_path):
    ranks = gpus.run(fit_on_cuda, strategy, WORLD, str(tmp_path), timeout=240)
    assert {rank["backend"] for rank in ranks} == {"nccl"}
    assert {rank["device"] for rank in ranks} == {"cuda"}
    # Each rank's loss is over its share of the global batch: their mean is single_device's.
    mean_losses = torch.tensor([rank["losses"] for rank in ranks]).mean(dim=0)
    torch.testing.assert_close(mean_losses, torch.tensor(single_device["losses"]), rtol=1e-4, atol=1e-5)
    assert all(peak > 0 for peak in ranks[0]["peak_memory_bytes"])


def test_dp_splits_each_batch_over_the_gpus_of_one_process_as_single_device_trains(single_device, tmp_path):
    run = fit_on_cuda("dp", cuda_device_count(), str(tmp_path))
    torch.testing.assert_close(torch.tensor(run["losses"]), torch.tensor(single_device["losses"]), rtol=1e-4, atol=1e-5)
