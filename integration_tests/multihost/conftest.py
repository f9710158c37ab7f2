"""The test hosts, and the single-device run every multi-host result is compared with."""

import subprocess
import sys

import pytest
import torch
from hosts import JOB, create_hosts, delete_hosts, why_unavailable


@pytest.fixture(scope="session")
def hosts(tmp_path_factory):
    reason = why_unavailable()
    if reason is not None:
        pytest.skip(f"multi-host tests need two network namespaces: {reason}")
    made = create_hosts(tmp_path_factory.mktemp("hosts"))
    yield made
    delete_hosts(made)


@pytest.fixture(scope="session")
def single_device_weights(tmp_path_factory):
    """The reference: one process on one host, the same global batch (16 samples a step, 6 steps)."""
    out = tmp_path_factory.mktemp("single")
    subprocess.run(
        [sys.executable, str(JOB), "--out", str(out), "--strategy", "single_device", "--num-nodes", "1"],
        check=True,
        timeout=180,
    )
    return torch.load(out / "weights.pt")
