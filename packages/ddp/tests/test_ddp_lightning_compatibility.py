"""Lightning spellings that need stratagem-ddp: collectives with group= and reduce_op=, and ddp_spawn
started from a session without a main file."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import stratagem
from stratagem.testing import DistributedWorkers


def _collectives_with_a_group() -> tuple[float, float, list[float], str]:
    strategy = stratagem.resolve(strategy="ddp", accelerator="cpu", devices=2)
    strategy.setup_environment()
    group = dist.new_group([0, 1])
    rank = torch.tensor([float(dist.get_rank() + 1)])
    summed = strategy.reduce(rank, reduce_op="sum", group=group).item()
    mean = strategy.reduce(rank, group=group).item()
    gathered = strategy.all_gather(rank, group=group).flatten().tolist()
    return summed, mean, gathered, strategy.reduce("unchanged", reduce_op="sum")


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_reduce_and_all_gather_take_lightnings_group_and_reduce_op_on_two_processes():
    with DistributedWorkers(2, env={"OMP_NUM_THREADS": "1"}) as workers:
        results = workers.run(_collectives_with_a_group)
    assert results == [(3.0, 1.5, [1.0, 2.0], "unchanged")] * 2


SPAWN_FROM_STDIN = """
import torch
from stratagem import Trainer
from stratagem.demo import DemoModule, demo_dataloaders

train, _ = demo_dataloaders(batch_size=8, num_samples=16)
Trainer(strategy="ddp_spawn", accelerator="cpu", devices=2, max_steps=1, logger=False).fit(DemoModule(hidden=4), train)
"""


@pytest.mark.timeout(120)
def test_ddp_spawn_from_a_session_without_a_main_file_says_to_use_ddp_fork_before_starting_anything():
    done = subprocess.run([sys.executable, "-"], input=SPAWN_FROM_STDIN, capture_output=True, text=True, timeout=100)
    assert done.returncode != 0
    assert "RuntimeError: start_method='spawn' starts each rank by re-importing your main module" in done.stderr
    assert "'ddp_notebook' or 'ddp_fork'" in done.stderr
    assert "FileNotFoundError" not in done.stderr
    assert "stratagem: rank" not in done.stderr, "refused before any rank started"
