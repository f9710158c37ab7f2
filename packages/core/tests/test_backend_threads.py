"""The wait that keeps a rank from aborting at exit while Gloo's worker threads still hold finished work."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(120)

PROBE = textwrap.dedent(
    """
    import torch, torch.distributed as dist
    from stratagem.environments.local import find_free_port
    from stratagem.strategies._backend_threads import _gloo_worker_threads, wait_for_idle_gloo_workers

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{find_free_port()}", rank=0, world_size=1)
    for _ in range(50):
        dist.broadcast(torch.ones(1000), 0)
        dist.all_reduce(torch.ones(1000))
    workers = _gloo_worker_threads()
    dist.destroy_process_group()
    print(len(workers), wait_for_idle_gloo_workers(timeout=10))
    """
)


def test_gloo_worker_threads_are_found_and_seen_idle_after_collectives():
    # The wait finds the workers by the thread name PyTorch gives them (or, on a torch that names
    # none, by the name they inherit); if a PyTorch upgrade renamed them, the wait would silently
    # do nothing, and this test says so.
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=100)
    assert result.returncode == 0, result.stderr
    # torch 2.9 prints Gloo's "Rank 0 is connected to 0 peer ranks" to stdout first.
    found, idle = result.stdout.splitlines()[-1].split()
    assert int(found) >= 1
    assert idle == "True"


def test_wait_returns_at_once_without_gloo_workers():
    from stratagem.strategies._backend_threads import wait_for_idle_gloo_workers

    assert wait_for_idle_gloo_workers(timeout=0.5) is True
