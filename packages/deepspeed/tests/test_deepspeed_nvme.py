"""NVMe offload: parameters and optimizer state swapped to files through DeepSpeed's async_io op.

The op links against libaio (Debian: libaio-dev), and its first build takes minutes: this is
the one module that compiles it. Without libaio the strategy refuses before launch, naming it.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from deepspeed_testing import STEPS_NVME, WORKER_ENV, reference_run, set_up, train_steps

import stratagem
from stratagem import registry
from stratagem.strategies import LoopSettings
from stratagem.testing import DistributedWorkers

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(900)]


def _train_offloaded_to_nvme(nvme_path: str) -> tuple[list[float], dict[str, torch.Tensor], list[str]]:
    strategy = registry.strategies.create("deepspeed_stage_3_offload_nvme", nvme_path=nvme_path)
    strategy = stratagem.resolve(strategy=strategy, accelerator="cpu", devices=2)
    strategy.connect_loop_settings(LoopSettings())
    strategy.setup_environment()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, optimizers = set_up(strategy)
    losses = train_steps(strategy, model, optimizers, STEPS_NVME)
    # DeepSpeed makes one swap folder per rank for parameters and for optimizer state (files appear
    # in them once tensors outgrow the CPU buffers, which this small model does not).
    swap_folders = sorted(str(path.relative_to(nvme_path)) for path in Path(nvme_path).glob("zero_stage_3/*/rank*"))
    return losses, strategy.module_full_state_dict(), swap_folders


def test_stage_3_offloaded_to_nvme_trains_like_one_process(tmp_path):
    with DistributedWorkers(2, env=WORKER_ENV) as workers:
        losses, weights, swap_folders = workers.run(_train_offloaded_to_nvme, str(tmp_path), timeout=840)[0]
    assert swap_folders == [
        "zero_stage_3/float32params/rank0", "zero_stage_3/float32params/rank1",
        "zero_stage_3/optimizer/rank0", "zero_stage_3/optimizer/rank1",
    ]  # fmt: skip
    reference_losses, reference_weights = reference_run(STEPS_NVME)
    assert losses == pytest.approx(reference_losses, abs=1e-5)
    for name, value in reference_weights.items():
        torch.testing.assert_close(weights[name], value, atol=1e-5, rtol=0, msg=name)


def test_without_a_usable_libaio_nvme_offload_is_refused_before_launch_naming_libaio_dev(monkeypatch, tmp_path):
    # DeepSpeed checks libaio by compiling and linking a call to io_submit; a compiler that fails
    # every build is what that check meets on a machine without libaio-dev.
    monkeypatch.setenv("CC", "false")
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    strategy = registry.strategies.create("deepspeed_stage_3_offload_nvme", nvme_path=str(tmp_path))
    with pytest.raises(RuntimeError, match=r"libaio.*apt-get install libaio-dev"):
        stratagem.resolve(strategy=strategy, accelerator="cpu", devices=2)
