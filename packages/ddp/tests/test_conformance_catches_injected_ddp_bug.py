"""The conformance kit, used as for ddp (test_ddp_conformance.py), fails ddp with a bug injected
(injected_ddp_bugs.py): DDP that does not broadcast rank 0's initial weights. The old kit, which seeded
every rank alike, could not see it."""

import os
from pathlib import Path

import pytest
import test_ddp_conformance

from stratagem.testing.conformance import run_conformance
from stratagem.testing.plugins import write_distribution

pytestmark = pytest.mark.distributed


@pytest.mark.timeout(900)
def test_the_ddp_conformance_class_fails_on_ddp_without_the_initial_broadcast(tmp_path, monkeypatch):
    recommended = test_ddp_conformance.TestDDPConforms
    write_distribution(
        tmp_path / "plugins",
        "stratagem-injected-ddp-bugs",
        {"stratagem.strategies": {"bugs": "injected_ddp_bugs:register"}},
    )
    paths = [str(tmp_path / "plugins"), str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, paths)))
    report = run_conformance(
        "ddp_bug_no_initial_broadcast",
        devices=recommended.devices,
        tolerance=recommended.tolerance,
        resume_steps=recommended.resume_steps,
        timeout=recommended.timeout,
        workdir=tmp_path / "run",
    )
    failed = {name for name, result in report.items() if not result["ok"]}
    assert {"ranks_agree_after_setup", "ranks_agree_after_fit", "matches_single_device"} <= failed, sorted(failed)
