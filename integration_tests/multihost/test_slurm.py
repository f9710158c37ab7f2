"""A real SLURM on the test hosts: srun, sbatch, a wrapper shell under srun, and preemption with requeue."""

from __future__ import annotations

import json
import shlex
import sys
import time

import pytest
import torch
from hosts import JOB, assert_close
from slurm_cluster import SlurmCluster, why_unavailable

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def slurm(hosts, tmp_path_factory):
    reason = why_unavailable()
    if reason is not None:
        pytest.skip(f"SLURM tests: {reason}")
    cluster = SlurmCluster(hosts, tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _job(out, *arguments: str) -> list[str]:
    return [sys.executable, str(JOB), "--out", str(out), *arguments]


@pytest.fixture(scope="module")
def uninterrupted_on_two_nodes(slurm, tmp_path_factory):
    """The job srun ran on both nodes, never interrupted: its output directory, and srun's result."""
    out = tmp_path_factory.mktemp("uninterrupted")
    return out, slurm.run(["srun", "-N2", "--ntasks-per-node=1", *_job(out, "--devices", "1", "--num-nodes", "2")])


def test_srun_on_two_nodes_trains_once_as_one_device(uninterrupted_on_two_nodes, single_device_weights):
    out, result = uninterrupted_on_two_nodes
    assert result.returncode == 0, result.stdout + result.stderr
    assert (out / "runs.log").read_text().splitlines()[0].endswith("world size 2")
    assert len((out / "runs.log").read_text().splitlines()) == 1
    assert_close(torch.load(out / "weights.pt"), single_device_weights)


def test_srun_tasks_under_a_wrapper_shell_are_the_ranks_of_one_training(slurm, tmp_path, single_device_weights):
    # The job is named "bash", which once read as an interactive session: each task then started a training of
    # its own with two processes, two duplicate runs.
    command = shlex.join(_job(tmp_path, "--devices", "2", "--num-nodes", "1"))
    result = slurm.run(["srun", "-N1", "-n2", "bash", "-c", command])
    assert result.returncode == 0, result.stdout + result.stderr
    runs = (tmp_path / "runs.log").read_text().splitlines()
    assert len(runs) == 1, runs
    assert runs[0].endswith("world size 2")
    assert_close(torch.load(tmp_path / "weights.pt"), single_device_weights)


def test_a_preempted_sbatch_job_saves_requeues_itself_and_ends_as_an_uninterrupted_run(
    slurm, tmp_path, single_device_weights, uninterrupted_on_two_nodes
):
    # USR1 here (SLURM's --signal=USR1@90); SIGTERM, preemption's signal, in test_multihost's hand-started run.
    signal_name = "USR1"
    job_command = _job(tmp_path, "--devices", "1", "--num-nodes", "2", "--preemption", "--step-seconds", "1")
    script = tmp_path / "train.sbatch"
    script.write_text(
        "#!/bin/bash\n"
        # As README's script (--signal=USR1@90 is inert here: the partition has no time limit).
        "#SBATCH --nodes=2 --ntasks-per-node=1 --requeue --signal=USR1@90 --open-mode=append\n"
        f"#SBATCH --output={tmp_path}/slurm-%j.out\n"
        f"srun {shlex.join([*job_command, '--ckpt-path', 'last'])}\n"
    )
    job = slurm.run(["sbatch", "--parsable", str(script)]).stdout.strip()
    deadline = time.monotonic() + 180
    checkpoints = tmp_path / "checkpoints"
    while not list(checkpoints.glob("*step=2.ckpt")):
        assert time.monotonic() < deadline, slurm.run(["scontrol", "show", "job", job]).stdout
        time.sleep(0.2)
    # As SLURM's --signal=USR1@90 or a preemption's SIGTERM reach every task of the step.
    slurm.run(["scancel", f"--signal={signal_name}", job])
    while (slurm.job_field(job, "Restarts"), slurm.job_field(job, "JobState")) != ("1", "PENDING"):
        assert time.monotonic() < deadline, slurm.run(["scontrol", "show", "job", job]).stdout
        time.sleep(0.2)
    # SLURM makes a requeued batch job eligible 120 s later (its BeginTime); a test need not wait that long.
    slurm.run(["scontrol", "update", f"JobId={job}", "StartTime=now"])
    while slurm.job_field(job, "JobState") != "COMPLETED":
        assert time.monotonic() < deadline, slurm.run(["scontrol", "show", "job", job]).stdout
        time.sleep(0.5)
    preempted = sorted(path.name for path in checkpoints.glob("preempted-step=*.ckpt"))
    assert len(preempted) == 1, preempted
    report = json.loads((tmp_path / "result.json").read_text())
    assert report["global_step"] == 6
    assert f"preempted-step={report['started_at_step']}.ckpt" == preempted[0]
    weights = torch.load(tmp_path / "weights.pt")
    assert_close(weights, single_device_weights)
    uninterrupted = torch.load(uninterrupted_on_two_nodes[0] / "weights.pt")
    assert weights.keys() == uninterrupted.keys()
    assert all(torch.equal(weights[name], uninterrupted[name]) for name in uninterrupted)  # bit for bit
    output = (tmp_path / f"slurm-{job}.out").read_text()
    assert f"SIG{signal_name}: saved " in output
    assert f"job {job} requeued" in output
