"""A checkpoint's loop counters and ``format_version`` are checked before a run uses them: a negative step or
epoch, or a format this stratagem does not know, is refused naming the file and the field, before training."""

import pytest
import torch
from trainer_testing import ClassifierModule, make_loader, quiet_trainer

from stratagem.checkpoint_io import CheckpointError


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("saved")
    trainer = quiet_trainer(root, max_steps=2)
    trainer.fit(ClassifierModule(), make_loader())
    trainer.save_checkpoint(root / "genuine.ckpt")
    return torch.load(root / "genuine.ckpt", weights_only=True)


def _crafted(saved, tmp_path, change):
    checkpoint = {**saved, "loops": {"fit": dict(saved["loops"]["fit"])}}
    change(checkpoint)
    path = tmp_path / "crafted.ckpt"
    torch.save(checkpoint, path)
    return path


class _CountsSteps(ClassifierModule):
    steps = 0

    def training_step(self, batch, batch_idx):
        type(self).steps += 1
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize(
    ("field", "value", "shown"),
    [
        ("global_step", -1_000_000_000, "global_step is -1000000000, not a non-negative int"),
        ("epoch", -1, "epoch is -1, not a non-negative int"),
        ("batches_in_epoch", -3, "batches_in_epoch is -3"),
        ("total_batches", 2.5, "total_batches is 2.5, not a non-negative int"),
        ("global_step", "7", "global_step is a str"),
        ("global_step", None, "global_step is missing"),
        ("epoch_finished", 1, "epoch_finished is 1, not a bool"),
    ],
)
def test_a_resume_from_invalid_loop_counters_is_refused_before_training(saved, tmp_path, field, value, shown):
    path = _crafted(saved, tmp_path, lambda checkpoint: checkpoint["loops"]["fit"].update({field: value}))
    _CountsSteps.steps = 0
    trainer = quiet_trainer(tmp_path, max_steps=4)
    with pytest.raises(CheckpointError, match=rf"crafted\.ckpt' cannot be resumed: in its loop state .*{shown}"):
        trainer.fit(_CountsSteps(), make_loader(), ckpt_path=path)
    assert _CountsSteps.steps == 0
    assert trainer.global_step == 0


def test_genuine_loop_counters_resume_where_the_run_stopped(saved, tmp_path):
    path = _crafted(saved, tmp_path, lambda checkpoint: None)
    trainer = quiet_trainer(tmp_path, max_steps=4)
    trainer.fit(ClassifierModule(), make_loader(), ckpt_path=path)
    assert trainer.global_step == 4


@pytest.mark.parametrize(
    ("version", "message"),
    [
        (99, "has checkpoint format 99, newer than this stratagem reads"),
        ("x", "has the format_version 'x'; a stratagem checkpoint has an int from 1"),
        (0, "has the format_version 0; stratagem checkpoints start at format 1"),
        (-5, "has the format_version -5"),
        (True, "has the format_version True"),
    ],
)
@pytest.mark.parametrize("load", ["fit", "load_from_checkpoint"])
def test_an_unknown_format_version_is_refused_naming_the_checkpoint(saved, tmp_path, version, message, load):
    path = _crafted(saved, tmp_path, lambda checkpoint: checkpoint.update(format_version=version))
    loads = {
        "fit": lambda: quiet_trainer(tmp_path, max_steps=4).fit(ClassifierModule(), make_loader(), ckpt_path=path),
        "load_from_checkpoint": lambda: ClassifierModule.load_from_checkpoint(path),
    }
    with pytest.raises(CheckpointError, match=rf"crafted\.ckpt' {message}"):
        loads[load]()
