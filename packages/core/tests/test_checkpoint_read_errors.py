"""Every checkpoint that cannot be read raises one CheckpointError naming the file and what is wrong,
from the Trainer and from ``stratagem consolidate`` (which then writes nothing)."""

import fractions
import os

import pytest
import torch
from trainer_testing import ClassifierModule, make_loader, quiet_trainer

from stratagem.checkpoint_io import CheckpointError, TorchCheckpointIO, read_full_checkpoint
from stratagem.cli.main import main


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A genuine Trainer checkpoint, and its bytes."""
    root = tmp_path_factory.mktemp("saved")
    trainer = quiet_trainer(root, max_steps=1)
    trainer.fit(ClassifierModule(), make_loader())
    path = root / "genuine.ckpt"
    trainer.save_checkpoint(path)
    return path.read_bytes()


def _write(tmp_path, content):
    path = tmp_path / "broken.ckpt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        torch.save(content, path)
    return path


@pytest.mark.parametrize("fraction", [0.05, 0.5, 0.95, 0.999])
def test_a_truncated_checkpoint_is_called_truncated_and_safety_stays_on(saved, tmp_path, fraction):
    path = _write(tmp_path, saved[: int(len(saved) * fraction)])
    with pytest.raises(CheckpointError, match=r"broken\.ckpt' is truncated or corrupt") as error:
        read_full_checkpoint(path, TorchCheckpointIO())
    assert "weights_only" not in str(error.value)


def test_an_empty_checkpoint_is_called_an_empty_file(tmp_path):
    path = _write(tmp_path, b"")
    with pytest.raises(CheckpointError, match=r"broken\.ckpt' is an empty file"):
        read_full_checkpoint(path, TorchCheckpointIO())


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("content", [os.urandom(4096), b"not a checkpoint\n", b"\x80\x04\x95\x00"])
def test_random_bytes_are_called_corrupt_without_advice_to_turn_safety_off(tmp_path, content):
    path = _write(tmp_path, content)
    with pytest.raises(CheckpointError, match="is truncated or corrupt") as error:
        read_full_checkpoint(path, TorchCheckpointIO())
    assert "weights_only" not in str(error.value)


def test_a_refused_global_is_named_and_the_opt_out_is_for_trusted_files_only(tmp_path):
    path = _write(tmp_path, {"module": {}, "value": fractions.Fraction(1, 3)})
    with pytest.raises(CheckpointError, match=r"references fractions\.Fraction.*Only if you trust the file"):
        read_full_checkpoint(path, TorchCheckpointIO())
    assert read_full_checkpoint(path, TorchCheckpointIO(), weights_only=False)["value"] == fractions.Fraction(1, 3)


def test_a_bare_state_dict_given_to_fit_is_named_as_such(tmp_path):
    path = _write(tmp_path, ClassifierModule().state_dict())
    trainer = quiet_trainer(tmp_path, max_steps=1)
    with pytest.raises(CheckpointError, match=r"not a stratagem checkpoint: it lacks 'module'.*bare state dict"):
        trainer.fit(ClassifierModule(), make_loader(), ckpt_path=path)


def test_a_list_given_to_validate_is_not_a_stratagem_checkpoint(tmp_path):
    path = _write(tmp_path, [torch.ones(2), 3])
    trainer = quiet_trainer(tmp_path)
    with pytest.raises(CheckpointError, match="not a stratagem checkpoint: it holds a list of 2 items"):
        trainer.validate(ClassifierModule(), make_loader(), ckpt_path=path)


@pytest.mark.parametrize("stage", ["fit", "validate"])
def test_a_truncated_checkpoint_given_to_the_trainer_is_one_checkpoint_error(saved, tmp_path, stage):
    path = _write(tmp_path, saved[: len(saved) // 2])
    trainer = quiet_trainer(tmp_path, max_steps=1)
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        getattr(trainer, stage)(ClassifierModule(), make_loader(), ckpt_path=path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ([torch.ones(2)], "not a stratagem checkpoint: it holds a list"),
        (b"", "is an empty file"),
        (b"\x00" * 64, "is truncated or corrupt"),
        ({"module": {}, "value": fractions.Fraction(1, 3)}, "references fractions.Fraction"),
    ],
)
def test_consolidate_exits_non_zero_with_the_reason_and_writes_nothing(tmp_path, capsys, content, message):
    source = _write(tmp_path, content)
    destination = tmp_path / "out.pt"
    assert main(["consolidate", str(source), str(destination)]) != 0
    error = capsys.readouterr().err
    assert message in error
    assert "broken.ckpt" in error
    assert "Traceback" not in error
    assert sorted(path.name for path in tmp_path.iterdir()) == ["broken.ckpt"]


@pytest.mark.parametrize(
    ("entry", "value", "message"),
    [
        ("loops", [1], "its 'loops' entry is a list, not a dict"),
        ("loops", {"other": {}}, "its 'loops' entry has no 'fit' dict"),
        ("lr_schedulers", {"a": 1}, "its 'lr_schedulers' entry is a dict, not a list"),
        ("format_version", "1", "has the format_version '1'"),
    ],
)
def test_a_malformed_trainer_entry_is_named(saved, tmp_path, entry, value, message):
    checkpoint = torch.load(_write(tmp_path, saved), weights_only=True)
    checkpoint[entry] = value
    path = _write(tmp_path, checkpoint)
    with pytest.raises(CheckpointError, match=message):
        quiet_trainer(tmp_path, max_steps=2).fit(ClassifierModule(), make_loader(), ckpt_path=path)
