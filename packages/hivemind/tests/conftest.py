"""End every peer or demo process a test started, also when the test failed or timed out."""

from __future__ import annotations

import pytest
from swarm_peers import STARTED


@pytest.fixture(autouse=True)
def _end_started_processes():
    yield
    while STARTED:
        process = STARTED.pop()
        if process.poll() is None:
            process.kill()
            process.wait()
