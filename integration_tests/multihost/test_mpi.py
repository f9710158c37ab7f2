"""A real Open MPI ``mpirun`` starting one rank on each test host (its remote-shell agent enters the host)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hosts import JOB, assert_close

pytestmark = pytest.mark.timeout(240)
AGENT = Path(__file__).with_name("mpi_agent.sh")


def test_mpirun_on_two_hosts_trains_once_as_one_device(hosts, tmp_path, single_device_weights):
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found: install Debian's openmpi-bin (.ci/run does)")
    first, second = hosts
    argv = [
        "mpirun", "--allow-run-as-root", "-np", "2", "-H", f"{first.name}:1,{second.name}:1",
        "--mca", "plm_rsh_agent", str(AGENT),
        "-x", f"MASTER_ADDR={first.address}", "-x", "MASTER_PORT=29555",
        sys.executable, str(JOB), "--out", str(tmp_path), "--devices", "1", "--num-nodes", "2",
    ]  # fmt: skip
    result = subprocess.run(
        first.command(argv),
        env={**os.environ, "STRATAGEM_TEST_HOSTS_DIR": str(first.hosts_file.parent)},
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    runs = (tmp_path / "runs.log").read_text().splitlines()
    assert len(runs) == 1, runs
    assert runs[0].startswith(f"{first.name} ")
    assert runs[0].endswith("world size 2")
    assert_close(torch.load(tmp_path / "weights.pt"), single_device_weights)
