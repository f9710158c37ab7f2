"""``ddp`` under elastic torchrun (``--nnodes=MIN:MAX``, c10d rendezvous): joining its ranks, and its restarts.

Every test runs ``elastic_job.py`` with ``python -m torch.distributed.run``, two processes on one
node, and reads what each rank reported. Each job carries a unique tag in its environment, so a
test can tell that none of its processes outlived it.
"""

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import ddp_job
import pytest
import torch

from stratagem.environments.local import find_free_port
from stratagem.testing import wait_until_no_process_has

pytestmark = pytest.mark.distributed

JOB = Path(__file__).with_name("elastic_job.py")
TAG = "STRATAGEM_TEST_TAG"
# Every elastic_job.CHECKPOINT_EVERY = 2 steps; an epoch is 4 steps.
SAVES = ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt", "epoch=1-step=6.ckpt"]


def _torchrun(out, *job_arguments, max_restarts=0, **extra_environment):
    """Run the job under elastic torchrun; return its exit code, output and pid, failing if a process outlives it."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1:2", "--nproc-per-node=2"]
    command += ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{find_free_port()}", f"--rdzv-id={uuid.uuid4().hex}"]
    # The rendezvous waits last_call_timeout (30 s by default) for more nodes once --nnodes' minimum is there.
    command += ["--rdzv-conf=last_call_timeout=1", f"--max-restarts={max_restarts}", "--monitor-interval=0.1"]
    command += [str(JOB), "--out", str(out), *job_arguments]
    tag = uuid.uuid4().hex
    environment = {key: value for key, value in os.environ.items() if key not in ("LOCAL_RANK", "MASTER_PORT")}
    environment.update(OMP_NUM_THREADS="1", **{TAG: tag}, **extra_environment)
    torchrun = subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = torchrun.communicate(timeout=100)
    except subprocess.TimeoutExpired:
        # SIGTERM, not SIGKILL: torchrun then ends its workers, which run in sessions of their own.
        torchrun.terminate()
        output, _ = torchrun.communicate(timeout=40)
        pytest.fail(f"torchrun did not finish within 100 s:\n{output}")
    finally:
        torchrun.kill()
        left_behind = wait_until_no_process_has(TAG, tag)
        for pid in left_behind:
            os.kill(pid, signal.SIGKILL)
    assert left_behind == [], f"processes {left_behind} outlived torchrun"
    return torchrun.returncode, output, torchrun.pid


def _report(out, rank, attempt):
    return json.loads((out / f"rank-{rank}-attempt-{attempt}.json").read_text())


def _weights(out, rank, attempt):
    return torch.load(out / f"rank-{rank}-attempt-{attempt}.pt", weights_only=True)


def _saves(out, rank, attempt):
    log = out / f"rank-{rank}-attempt-{attempt}.saves"
    return log.read_text().split() if log.exists() else []


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("elastic")
    returncode, output, pid = _torchrun(out, max_restarts=1)
    assert returncode == 0, output
    return out, pid


@pytest.mark.timeout(150)
def test_ddp_joins_the_two_ranks_torchrun_started_and_each_trains_once(uninterrupted):
    out, torchrun_pid = uninterrupted
    reports = [_report(out, rank, 0) for rank in (0, 1)]
    assert sorted(out.glob("*.json")) == [out / "rank-0-attempt-0.json", out / "rank-1-attempt-0.json"]
    for rank, report in enumerate(reports):
        assert report["environment"] == "TorchElasticEnvironment"
        assert (report["global_rank"], report["world_size"], report["process_group_size"]) == (rank, 2, 2)
        # torchrun's own children, not ranks re-launched by stratagem's ddp launcher.
        assert report["ppid"] == torchrun_pid
        assert report["steps_run"] == report["global_step"] == ddp_job.MAX_STEPS
        assert report["seen"] == report["given"]
    assert reports[0]["pid"] != reports[1]["pid"]


@pytest.mark.timeout(150)
def test_elastic_training_leaves_the_same_weights_on_every_rank(uninterrupted):
    out, _ = uninterrupted
    on_rank_0, on_rank_1 = _weights(out, 0, 0), _weights(out, 1, 0)
    assert on_rank_0.keys() == on_rank_1.keys()
    for key in on_rank_0:
        assert torch.equal(on_rank_0[key], on_rank_1[key])


@pytest.mark.timeout(150)
def test_each_checkpoint_is_written_once_by_rank_0(uninterrupted):
    out, _ = uninterrupted
    assert _saves(out, 0, 0) == SAVES
    assert _saves(out, 1, 0) == []
    assert sorted(path.name for path in (out / "checkpoints").iterdir()) == SAVES


@pytest.mark.timeout(150)
def test_a_rank_failing_once_is_restarted_by_torchrun_and_the_job_resumes_from_the_last_checkpoint(
    uninterrupted, tmp_path
):
    # torchrun's default: one store for every attempt, which still holds the failed attempt's keys.
    returncode, output, torchrun_pid = _torchrun(tmp_path, "--fail-at-step", "5", max_restarts=1)
    assert returncode == 0, output
    assert (tmp_path / "rank-1-attempt-0.failed").exists()
    assert not list(tmp_path.glob("*-attempt-0.json"))
    for rank in (0, 1):
        report = _report(tmp_path, rank, 1)
        assert (report["global_rank"], report["world_size"], report["process_group_size"]) == (rank, 2, 2)
        assert report["ppid"] == torchrun_pid
        # What torchrun gave the second attempt, read afresh in the new processes.
        assert report["seen"] == report["given"]
        assert report["started_at_step"] == 4
        assert report["steps_run"] == ddp_job.MAX_STEPS - 4
    assert _saves(tmp_path, 0, 0) == SAVES[:2]
    assert _saves(tmp_path, 0, 1) == SAVES[2:]
    assert _saves(tmp_path, 1, 0) == _saves(tmp_path, 1, 1) == []
    expected = _weights(uninterrupted[0], 0, 0)
    for rank in (0, 1):
        resumed = _weights(tmp_path, rank, 1)
        for key in expected:
            assert torch.equal(resumed[key], expected[key])
