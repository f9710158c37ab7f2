"""xla_fsdp_v2 (SPMD) on 2 of XLA's CPU devices, in a process of its own, against plain CPU training."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def spmd_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("spmd")
    environment = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "2", "PYTHONPATH": str(HERE)}
    finished = subprocess.run(
        [sys.executable, str(HERE / "spmd_script.py"), str(workdir)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=240,
    )
    assert finished.returncode == 0, finished.stderr[-4000:]
    return json.loads(finished.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(300)
def test_xla_fsdp_v2_on_two_devices_trains_to_the_weights_of_plain_cpu_training(spmd_run):
    assert spmd_run["steps"] == 16
    assert spmd_run["difference"] < 1e-5
    assert spmd_run["val_loss"] == pytest.approx(spmd_run["cpu_val_loss"], rel=1e-5)


@pytest.mark.timeout(300)
def test_xla_fsdp_v2_shards_parameters_over_the_mesh(spmd_run):
    assert "devices=[2" in spmd_run["sharding"]


@pytest.mark.timeout(300)
def test_an_xla_fsdp_v2_checkpoint_holds_whole_weights_that_single_device_validates_alike(spmd_run):
    assert spmd_run["reloaded_equal"]
    assert spmd_run["reloaded_loss"] == pytest.approx(spmd_run["val_loss"], rel=1e-5)
