"""``max_time`` ends a fit at a step boundary once the time is spent; ``fast_dev_run`` runs a few batches of each
pass and writes nothing."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
import torch
from trainer_testing import ClassifierModule, make_loader, quiet_trainer

import stratagem
from stratagem.callbacks import ModelCheckpoint


@pytest.mark.parametrize("given", [timedelta(hours=1), {"hours": 1}, {"minutes": 30, "seconds": 1800}, "00:01:00:00"])
def test_max_time_is_accepted_as_a_timedelta_a_dict_or_dd_hh_mm_ss(tmp_path, given):
    assert quiet_trainer(tmp_path, max_time=given).settings.max_time == timedelta(hours=1)


class SlowSteps(ClassifierModule):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        time.sleep(0.02)
        return super().training_step(batch, batch_idx)


def test_max_time_stops_at_a_step_boundary_and_saves_as_the_end_of_a_fit_does(tmp_path, capsys):
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "checkpoints")
    trainer = quiet_trainer(
        tmp_path,
        max_time=timedelta(milliseconds=100),
        max_epochs=-1,
        accumulate_grad_batches=2,
        enable_checkpointing=True,
        callbacks=[checkpoint],
    )
    trainer.fit(SlowSteps(), make_loader())
    # 40 ms or more per optimizer step: a few steps, with no epoch limit, and never inside an accumulation window.
    assert 1 <= trainer.global_step < 20
    assert trainer.fit_progress.total_batches == 2 * trainer.global_step
    saved = sorted(path.name for path in (tmp_path / "checkpoints").iterdir())
    assert saved == [f"epoch={trainer.current_epoch}-step={trainer.global_step}.ckpt"]
    assert f"max_time=0:00:00.100000 reached at step {trainer.global_step}; stopping." in capsys.readouterr().err


class CountingModule(ClassifierModule):
    def __init__(self) -> None:
        super().__init__()
        self.steps = {"train": 0, "validation": 0, "test": 0, "predict": 0}

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.steps["train"] += 1
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch: Any, batch_idx: int, *args: Any) -> None:
        self.steps["validation"] += 1
        super().validation_step(batch, batch_idx)

    def test_step(self, batch: Any, batch_idx: int, *args: Any) -> None:
        self.steps["test"] += 1
        super().test_step(batch, batch_idx)

    def predict_step(self, batch: Any, batch_idx: int, *args: Any) -> torch.Tensor:
        self.steps["predict"] += 1
        return super().predict_step(batch, batch_idx)


@pytest.mark.parametrize(("fast_dev_run", "batches"), [(True, 1), (3, 3)])
def test_fast_dev_run_runs_n_batches_of_every_pass_and_writes_no_checkpoint_or_log(tmp_path, fast_dev_run, batches):
    root = tmp_path / "root"
    trainer = stratagem.Trainer(
        accelerator="cpu", fast_dev_run=fast_dev_run, max_epochs=5, default_root_dir=root, enable_progress_bar=False
    )
    assert trainer.fast_dev_run == batches
    assert trainer.loggers == []
    module = CountingModule()
    trainer.fit(module, make_loader(), make_loader())
    assert module.steps == {"train": batches, "validation": batches, "test": 0, "predict": 0}
    assert trainer.global_step == batches
    assert trainer.current_epoch == 1
    trainer.test(module, make_loader())
    assert len(trainer.predict(module, make_loader())) == batches
    assert module.steps == dict.fromkeys(module.steps, batches)
    assert not root.exists() or not any(root.rglob("*"))
