"""The package README's two terminal commands: ``stratagem demo --strategy hivemind`` twice, the second given the
first's address, train one model with two peers; the checkpoint evaluates under ``single_device``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from swarm_peers import JOIN_LINE, STARTED, wait_for

pytestmark = pytest.mark.timeout(660)

STEPS = 10
"""Five collaborative epochs: each round that finds no group on a busy machine waits out averaging_timeout (30 s)."""


def _demo(directory: Path, environment: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "stratagem.cli.main", "demo", "--strategy", "hivemind"]
    command += ["--max-steps", str(STEPS), "--logger", "none", "--root-dir", str(directory)]
    with log.open("w") as output:
        process = subprocess.Popen(
            command, stdout=output, stderr=subprocess.STDOUT, env=environment, cwd=directory.parent
        )
    STARTED.append(process)
    return process


def test_two_demo_commands_train_one_model_whose_checkpoint_evaluates_under_single_device(tmp_path):
    base = {key: value for key, value in os.environ.items() if not key.startswith("STRATAGEM_HIVEMIND_")}
    base["OMP_NUM_THREADS"] = "1"
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    first = _demo(tmp_path / "first", {**base, "STRATAGEM_HIVEMIND_MIN_PEERS": "2"}, first_log)
    found = wait_for(lambda: JOIN_LINE.search(first_log.read_text()), 120, "the first peer's join line")
    joining = {**base, "STRATAGEM_HIVEMIND_MIN_PEERS": "2", "STRATAGEM_HIVEMIND_INITIAL_PEERS": found.group(1)}
    second = _demo(tmp_path / "second", joining, second_log)
    for process, log in ((first, first_log), (second, second_log)):
        try:
            code = process.wait(540)
        except subprocess.TimeoutExpired:
            first.kill()
            second.kill()
            raise AssertionError(f"{log.name} did not finish:\n{log.read_text()[-6000:]}") from None
        assert code == 0, log.read_text()[-6000:]
        assert f"done after {STEPS} steps" in log.read_text()

    from stratagem import Trainer
    from stratagem.demo import DemoModule, demo_dataloaders

    [checkpoint] = sorted((tmp_path / "first").rglob("*.ckpt"))
    module = DemoModule()
    trainer = Trainer(strategy="single_device", logger=False, enable_progress_bar=False, enable_checkpointing=False)
    [metrics] = trainer.validate(module, demo_dataloaders(batch_size=64)[1], ckpt_path=checkpoint)
    assert torch.isfinite(torch.tensor(metrics["val_loss"]))
    saved = torch.load(checkpoint, weights_only=True)
    assert saved["hivemind"]["epoch"] > 0
