"""Trainer(strategy="horovod", devices=2) trains to the weights ddp trains to, on the same global batch.

Each case runs ``horovod_job.py`` as users run a script: under ``ddp``, under ``horovod`` with ranks
started by stratagem, and under ``horovod`` with ranks started by ``horovodrun --gloo``.
"""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(400)]

JOB = Path(__file__).with_name("horovod_job.py")
CASES = {
    "one_batch_per_step": [],
    # backward_passes_per_step=2, and the gradients averaged before they are clipped.
    "accumulate_2_and_clip": ["--accumulate", "2", "--clip", "0.05"],
}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _train(launch: str, options: list[str], out: Path) -> list[dict[str, torch.Tensor]]:
    environment = {key: value for key, value in os.environ.items() if key not in ("LOCAL_RANK", "MASTER_PORT")}
    strategy = "ddp" if launch == "ddp" else "horovod"
    command = [sys.executable, str(JOB), "--strategy", strategy, "--out", str(out), *options]
    if launch == "horovodrun":
        horovodrun = Path(sys.executable).with_name("horovodrun")
        command = [str(horovodrun), "--gloo", "-np", "2", "-H", "localhost:2", *command]
        environment["MASTER_PORT"] = str(_free_port())
    completed = subprocess.run(
        command, env={**environment, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    # The job's StepLR is made for the user's optimizer; stepping horovod's copy must not look like a wrong order.
    assert "lr_scheduler.step()` before `optimizer.step()`" not in completed.stderr
    return [torch.load(out / f"rank-{rank}.pt", weights_only=True) for rank in (0, 1)]


@pytest.fixture(scope="module", params=list(CASES))
def trained(request, tmp_path_factory):
    options = CASES[request.param]
    return {
        launch: _train(launch, options, tmp_path_factory.mktemp(f"{launch}-{request.param}"))
        for launch in ("horovod", "ddp", "horovodrun")
    }


@pytest.mark.parametrize("launch", ["horovod", "horovodrun"])
def test_both_horovod_ranks_end_with_identical_weights(trained, launch):
    rank0, rank1 = trained[launch]
    assert rank0.keys() == rank1.keys()
    for key in rank0:
        assert torch.equal(rank0[key], rank1[key]), key


@pytest.mark.parametrize("launch", ["horovod", "horovodrun"])
def test_horovod_weights_match_ddp_on_the_same_global_batch(trained, launch):
    horovod, ddp = trained[launch][0], trained["ddp"][0]
    assert horovod.keys() == ddp.keys()
    for key in ddp:
        torch.testing.assert_close(horovod[key], ddp[key], rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def fp16_compressed(tmp_path_factory):
    return {
        launch: _train(launch, options, tmp_path_factory.mktemp(f"{launch}-fp16"))
        for launch, options in (("horovod", ["--compression", "fp16"]), ("ddp", []))
    }


def test_fp16_compressed_gradients_keep_ranks_identical_and_close_to_ddp(fp16_compressed):
    rank0, rank1 = fp16_compressed["horovod"]
    ddp = fp16_compressed["ddp"][0]
    for key in ddp:
        assert torch.equal(rank0[key], rank1[key]), key
        # Gradients travel as fp16 (about 3 significant digits), so the weights drift from fp32 ddp's a little.
        torch.testing.assert_close(rank0[key], ddp[key], rtol=1e-2, atol=1e-3)
    assert any(not torch.equal(rank0[key], ddp[key]) for key in ddp), "fp16 compression left no trace"
