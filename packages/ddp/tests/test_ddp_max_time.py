"""``max_time`` under ddp: ranks that reach it at different times still stop together, at one step, and save."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(180)]

JOB = textwrap.dedent(
    """
    import json, sys, time
    from datetime import timedelta
    from pathlib import Path

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    import stratagem
    from stratagem.callbacks import Callback, ModelCheckpoint

    out = Path(sys.argv[1])


    class Module(stratagem.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            # Only rank 1 is slow: it alone runs out of time, and rank 0 must stop with it.
            if self.trainer.global_rank == 1:
                time.sleep(0.05)
            return self.layer(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)


    class RecordStop(Callback):
        def on_train_end(self, trainer, module):
            (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(trainer.global_step))


    if __name__ == "__main__":
        trainer = stratagem.Trainer(
            accelerator="cpu", strategy="ddp_fork", devices=2, max_time={"seconds": 0.3}, max_epochs=-1,
            logger=False, enable_progress_bar=False, num_sanity_val_steps=0, default_root_dir=out,
            callbacks=[RecordStop(), ModelCheckpoint(dirpath=out / "checkpoints")],
        )
        data = TensorDataset(torch.randn(64, 4))
        trainer.fit(Module(), DataLoader(data, batch_size=4))
    """
)


def test_ranks_that_run_out_of_time_at_different_steps_stop_together_and_save(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    environment = {key: value for key, value in os.environ.items() if key not in ("LOCAL_RANK", "MASTER_PORT")}
    completed = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        env={**environment, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    steps = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert steps[0] == steps[1]
    assert 1 <= steps[0] < 1000
    assert sorted(path.name for path in (tmp_path / "checkpoints").iterdir()) == [
        f"epoch={steps[0] // 8}-step={steps[0]}.ckpt"
    ]
    assert f"reached at step {steps[0]}; stopping." in completed.stderr
