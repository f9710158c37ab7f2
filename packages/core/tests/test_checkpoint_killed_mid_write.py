"""A process killed while writing a checkpoint leaves the previous checkpoint whole and loadable."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from stratagem.callbacks.model_checkpoint import find_last_checkpoint
from stratagem.checkpoint_io import temporary_siblings

# A training run whose every step rewrites last.ckpt (~100 MB, so each write takes a while).
_TRAINING_SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    import stratagem
    from stratagem.callbacks import ModelCheckpoint

    class Big(stratagem.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(25_000_000))

        def training_step(self, batch, batch_idx):
            return (self.weight[:10] - batch).pow(2).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    checkpoints = ModelCheckpoint(dirpath=sys.argv[1], every_n_train_steps=1, save_top_k=0, save_last=True)
    trainer = stratagem.Trainer(
        accelerator="cpu", max_steps=1000, logger=False, enable_progress_bar=False, callbacks=[checkpoints]
    )
    trainer.fit(Big(), [torch.ones(10)] * 1000)
    """
)


def _kill_during_second_write(directory: Path, deadline: float) -> bool:
    """Start the run, SIGKILL it while a write after the first is in progress; True if it was mid-write."""
    process = subprocess.Popen([sys.executable, "-c", _TRAINING_SCRIPT, str(directory)], env={**os.environ})
    try:
        last = directory / "last.ckpt"
        while time.monotonic() < deadline and process.poll() is None:
            if last.exists() and temporary_siblings(last):
                process.send_signal(signal.SIGKILL)
                break
            time.sleep(0.001)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode == -signal.SIGKILL and bool(temporary_siblings(last))


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sigkill_during_a_checkpoint_write_leaves_the_previous_checkpoint_loadable(tmp_path):
    deadline = time.monotonic() + 150
    for attempt in range(5):
        directory = tmp_path / f"attempt{attempt}"
        directory.mkdir()
        if _kill_during_second_write(directory, deadline):
            break
    else:
        pytest.fail("never caught the process in the middle of a checkpoint write")

    last = directory / "last.ckpt"
    assert find_last_checkpoint(directory) == last
    checkpoint = torch.load(last, weights_only=True)
    assert checkpoint["loops"]["fit"]["global_step"] >= 1
    assert checkpoint["module"]["weight"].shape == (25_000_000,)
    assert checkpoint["format_version"] == 1
