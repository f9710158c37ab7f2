"""``torch.compile(submodule)`` inside ``configure_model`` under ZeRO-3, in a process that has not imported dynamo
yet (as a user's script has not): zero.Init must neither recurse in ``OptimizedModule`` nor break dynamo's import."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from deepspeed_testing import WORKER_ENV

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]

SCRIPT = """
import sys, torch
from torch import nn
import stratagem
strategy = stratagem.resolve(strategy="deepspeed_stage_3", accelerator="cpu", devices=1)
strategy.setup_environment()
assert "torch._dynamo" not in sys.modules
with strategy.module_init_context():
    compiled = torch.compile(nn.Linear(4, 4), backend="eager")
assert type(compiled).__name__ == "OptimizedModule"
strategy.teardown()
"""


def test_torch_compile_inside_zero_init_builds_an_optimized_module_before_dynamo_was_imported():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, **WORKER_ENV, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    result = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, result.stderr[-4000:]
