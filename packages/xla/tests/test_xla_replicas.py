"""strategy='xla' and 'xla_fsdp': replicas started by xmp.spawn, in a fresh process (xmp.spawn refuses to start
replicas in a process whose XLA runtime runs already, as this test process's does).

On XLA's CPU device, xmp.spawn starts one replica process (torch_xla 2.9 refuses nprocs=2 there, and
CPU_NUM_DEVICES=2 gives two threads of one process, which one Trainer cannot drive). So this checks the launcher
end to end with one replica: the spawned process trains, its result comes back, and a failing replica ends the
job with its error. Several replicas run only on TPU hardware (see the package README)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def replica_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("replicas")
    environment = {**os.environ, "PJRT_DEVICE": "CPU", "PYTHONPATH": str(HERE)}
    finished = subprocess.run(
        [sys.executable, str(HERE / "replica_script.py"), "xla", str(workdir)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=400,
    )
    assert finished.returncode == 0, finished.stderr[-4000:]
    return json.loads(finished.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(450)
def test_a_replica_started_by_xmp_spawn_trains_like_plain_cpu_and_hands_its_weights_back(replica_run):
    assert replica_run["steps"] == 16
    assert replica_run["difference"] < 1e-5
    assert replica_run["weights_on"] == ["cpu"]
    assert replica_run["val_loss"] == pytest.approx(replica_run["cpu_val_loss"], rel=1e-5)


@pytest.mark.timeout(450)
def test_a_failing_replica_ends_the_job_with_its_error(replica_run):
    assert (
        replica_run["failure"] == "An XLA replica failed, and the job was ended: ValueError: replica failure at batch 3"
    )


@pytest.mark.timeout(450)
def test_xla_fsdp_trains_like_plain_cpu_and_its_sharded_checkpoint_consolidates_for_single_device(replica_run):
    assert replica_run["fsdp_steps"] == 16
    assert replica_run["fsdp_keys"] == ["net.0.bias", "net.0.weight", "net.2.bias", "net.2.weight"]
    assert replica_run["fsdp_difference"] < 1e-5
    assert replica_run["fsdp_consolidated_loss"] == pytest.approx(replica_run["fsdp_val_loss"], rel=1e-6)
    assert replica_run["fsdp_val_loss"] == pytest.approx(replica_run["cpu_val_loss"], rel=1e-5)
