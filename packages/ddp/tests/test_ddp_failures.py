"""No hangs, nothing silent: a stuck collective, and a rank killed in the middle of training."""

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch

import stratagem
from stratagem.launchers import RankFailedError
from stratagem.strategies.step_calls import step_calls
from stratagem.testing import wait_until_no_process_has
from stratagem_ddp import DDPStrategy

pytestmark = pytest.mark.distributed

JOB = Path(__file__).with_name("ddp_job.py")
TAG = "STRATAGEM_TEST_TAG"


def _one_rank_waits_at_a_barrier(strategy):
    strategy.setup_environment()
    if strategy.global_rank == 0:
        strategy.barrier("stuck-on-purpose")
    else:
        time.sleep(60)


def test_a_collective_stuck_past_the_timeout_ends_the_run_naming_the_collective():
    strategy = stratagem.resolve(strategy=DDPStrategy(start_method="spawn", timeout=3), accelerator="cpu", devices=2)
    started = time.monotonic()
    with pytest.raises(RankFailedError) as caught:
        strategy.launcher.launch(_one_rank_waits_at_a_barrier, strategy)
    assert time.monotonic() - started < 40
    assert caught.value.rank == 0
    assert "The collective barrier 'stuck-on-purpose' did not complete within timeout=0:00:03 on rank 0" in str(
        caught.value
    )


def _wait_for(path, timeout=90):
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.1)
    return int(path.read_text())


@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_sigkill_of_one_rank_mid_training_ends_the_whole_job_naming_it(tmp_path, strategy):
    tag = uuid.uuid4().hex
    environment = {key: value for key, value in os.environ.items() if key not in ("LOCAL_RANK", "MASTER_PORT")}
    job = subprocess.Popen(
        [sys.executable, str(JOB), "--strategy", strategy, "--out", str(tmp_path), "--scenarios", "endless"],
        env={**environment, TAG: tag, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait_for(tmp_path / "rank-0.pid")
        victim = _wait_for(tmp_path / "rank-1.pid")
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        output, _ = job.communicate(timeout=60)
        assert time.monotonic() - killed_at < 30
    finally:
        job.kill()
    assert job.returncode != 0
    assert f"rank 1 (pid {victim}) was killed by SIGKILL" in output
    assert wait_until_no_process_has(TAG, tag) == []


def _one_rank_skips_backward(strategy, through_step_calls):
    strategy.setup_environment()
    model = strategy.setup_module(torch.nn.Linear(4, 1))
    if strategy.global_rank == 0:
        loss = model(torch.ones(2, 4)).sum()
        if through_step_calls:
            step_calls(strategy, "forward", None).backward(loss)
        else:
            strategy.backward(loss, None)
    else:
        time.sleep(60)


# The loops call DDP's backward through its step calls (the plain tensor backward where nothing else is needed).
@pytest.mark.parametrize("through_step_calls", [False, True], ids=["strategy_backward", "loop_step_calls"])
def test_a_gradient_all_reduce_stuck_past_the_timeout_names_ddp_backward(through_step_calls):
    strategy = stratagem.resolve(strategy=DDPStrategy(start_method="spawn", timeout=3), accelerator="cpu", devices=2)
    with pytest.raises(RankFailedError) as caught:
        strategy.launcher.launch(_one_rank_skips_backward, strategy, through_step_calls)
    assert caught.value.rank == 0
    assert "all_reduce of gradients (DDP, during backward) did not complete within timeout=0:00:03" in str(caught.value)
