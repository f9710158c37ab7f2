"""The Trainer on FSDP, as a user runs it: scripts and the ``stratagem`` command started as real processes
(the launcher re-runs them for rank 1), then their checkpoints moved between strategies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fsdp_trainer_script import HIDDEN
from torch.utils._pytree import tree_flatten

from stratagem import Trainer
from stratagem.checkpoint_io import TorchCheckpointIO, read_full_checkpoint
from stratagem.demo import DemoModule, demo_dataloaders

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(240)]

SCRIPT = Path(__file__).with_name("fsdp_trainer_script.py")
STEPS = 12
WORKER_ENV = {"OMP_NUM_THREADS": "1"}


def run(*arguments: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        arguments, cwd=cwd, env={**os.environ, **WORKER_ENV}, capture_output=True, text=True, timeout=200
    )
    assert result.returncode == 0, f"exit code {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return result


def run_script(root: Path, *arguments: str) -> Path:
    run(sys.executable, str(SCRIPT), "--root", str(root), *arguments, cwd=root.parent)
    return root


def only_checkpoint(root: Path) -> Path:
    """The one checkpoint of the one run under ``root``."""
    [checkpoint] = (root / "checkpoints" / "version_0").iterdir()
    return checkpoint


def live_weights(root: Path) -> dict[str, torch.Tensor]:
    return torch.load(root / "live_weights.pt", weights_only=True)


def assert_identical(weights: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert set(weights) == set(expected)
    for name, value in expected.items():
        assert torch.equal(weights[name], value), name


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory) -> Path:
    """A fit of 12 steps on 2 processes with fsdp: its sharded checkpoint and live weights, a checkpoint saved
    from on_train_end, and one saved by trainer.save_checkpoint once fit had returned."""
    return run_script(
        tmp_path_factory.mktemp("fsdp") / "run", "--max-steps", str(STEPS), "--save-at-train-end", "--save-after-fit"
    )


@pytest.fixture(scope="module")
def interrupted_run(tmp_path_factory) -> Path:
    """The same fit stopped after half its steps."""
    return run_script(tmp_path_factory.mktemp("interrupted") / "run", "--stop-after", str(STEPS // 2))


def test_stratagem_demo_trains_fsdp_on_two_cpu_processes(tmp_path):
    stratagem = Path(sys.executable).with_name("stratagem")
    result = run(
        str(stratagem), "demo", "--strategy", "fsdp", "--devices", "2", "--max-steps", "20",
        "--root-dir", str(tmp_path / "demo"), "--logger", "none",
        cwd=tmp_path,
    )  # fmt: skip
    assert "done after 20 steps" in result.stdout
    checkpoint = only_checkpoint(tmp_path / "demo")
    assert (checkpoint / ".metadata").is_file()


def test_the_checkpoint_is_a_directory_of_shards_and_nothing_temporary_is_left(fsdp_run):
    checkpoint = only_checkpoint(fsdp_run)
    assert checkpoint.name == f"epoch=0-step={STEPS}.ckpt"
    assert sorted(path.name for path in checkpoint.iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
        "plain_state.pt",
    ]
    assert not [path for path in checkpoint.parent.iterdir() if path.name.startswith(".")]


def test_a_fit_stopped_and_resumed_under_fsdp_ends_with_bitwise_the_same_weights(fsdp_run, interrupted_run, tmp_path):
    resumed = tmp_path / "resumed"
    run_script(resumed, "--ckpt-path", str(only_checkpoint(interrupted_run)))
    assert_identical(live_weights(resumed), live_weights(fsdp_run))


def test_a_fit_saved_by_fsdp_resumes_under_ddp_and_ends_where_fsdp_ends(fsdp_run, interrupted_run, tmp_path):
    resumed = run_script(tmp_path / "ddp", "--strategy", "ddp", "--ckpt-path", str(only_checkpoint(interrupted_run)))
    expected = live_weights(fsdp_run)
    weights = live_weights(resumed)
    assert set(weights) == set(expected)
    for name, value in expected.items():
        torch.testing.assert_close(weights[name], value, rtol=1e-5, atol=1e-6)


def test_the_fsdp_checkpoint_validates_under_ddp_with_identical_weights(fsdp_run, tmp_path):
    root = run_script(
        tmp_path / "ddp", "--strategy", "ddp", "--validate", "--ckpt-path", str(only_checkpoint(fsdp_run))
    )
    assert_identical(live_weights(root), live_weights(fsdp_run))
    assert json.loads((root / "results.json").read_text())[0].keys() == {"val_loss", "val_acc"}


def test_a_module_fitted_under_fsdp_validates_in_the_same_script_with_its_trained_shards(fsdp_run, tmp_path):
    root = run_script(tmp_path / "again", "--max-steps", str(STEPS), "--validate-after-fit")
    assert_identical(live_weights(root), live_weights(fsdp_run))
    assert json.loads((root / "results.json").read_text())[0].keys() == {"val_loss", "val_acc"}


def test_the_fsdp_checkpoint_evaluates_under_single_device_with_identical_weights(fsdp_run):
    trainer = Trainer(strategy="single_device", accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    module = DemoModule(hidden=HIDDEN)
    _, val_loader = demo_dataloaders(batch_size=16, num_samples=512)
    [metrics] = trainer.validate(module, val_loader, ckpt_path=only_checkpoint(fsdp_run))
    assert_identical(module.state_dict(), live_weights(fsdp_run))
    assert set(metrics) == {"val_loss", "val_acc"}


def test_save_checkpoint_after_fit_returned_writes_what_on_train_end_saved(fsdp_run):
    assert not list(fsdp_run.glob("after_fit_rank*.error"))
    after_fit = read_full_checkpoint(fsdp_run / "after_fit.ckpt", TorchCheckpointIO())
    train_end = read_full_checkpoint(fsdp_run / "train_end.ckpt", TorchCheckpointIO())
    for entry in ("module", "optimizers", "loops", "lr_schedulers"):
        actual, actual_layout = tree_flatten(after_fit[entry])
        expected, expected_layout = tree_flatten(train_end[entry])
        assert actual_layout == expected_layout, entry
        for value, other in zip(actual, expected, strict=True):
            assert torch.equal(value, other) if isinstance(value, torch.Tensor) else value == other, entry


def test_a_checkpoint_saved_after_fit_gives_the_same_loss_under_single_device(fsdp_run):
    _, val_loader = demo_dataloaders(batch_size=16, num_samples=512)
    [expected] = _single_device_trainer().validate(
        DemoModule(hidden=HIDDEN), val_loader, ckpt_path=fsdp_run / "train_end.ckpt"
    )
    module = DemoModule(hidden=HIDDEN)
    [metrics] = _single_device_trainer().validate(module, val_loader, ckpt_path=fsdp_run / "after_fit.ckpt")
    assert_identical(module.state_dict(), live_weights(fsdp_run))
    assert metrics["val_loss"] == expected["val_loss"]


def test_async_saves_replace_the_top_checkpoint_only_once_the_new_one_is_whole(fsdp_run, tmp_path):
    root = run_script(tmp_path / "async", "--plugins", "async", "--checkpoint-every", "4", "--save-after-fit")
    checkpoint = only_checkpoint(root)
    assert checkpoint.name == f"epoch=0-step={STEPS}.ckpt"
    assert {".metadata", "plain_state.pt"} <= {path.name for path in checkpoint.iterdir()}
    assert not [path for path in checkpoint.parent.iterdir() if path.name.startswith(".")]
    saved = read_full_checkpoint(checkpoint, TorchCheckpointIO())
    assert_identical(saved["module"], live_weights(fsdp_run))
    assert saved["loops"]["fit"]["global_step"] == STEPS
    # Saved after fit returned, in the background, and finished before the ranks parted again.
    assert not list(root.glob("after_fit_rank*.error"))
    assert_identical(read_full_checkpoint(root / "after_fit.ckpt", TorchCheckpointIO())["module"], saved["module"])


def test_a_checkpoint_saved_at_train_end_gives_the_same_loss_under_single_device(fsdp_run):
    _, val_loader = demo_dataloaders(batch_size=16, num_samples=512)
    trained = DemoModule(hidden=HIDDEN)
    trained.configure_model()
    trained.load_state_dict(live_weights(fsdp_run))
    [expected] = _single_device_trainer().validate(trained, val_loader)
    module = DemoModule(hidden=HIDDEN)
    [metrics] = _single_device_trainer().validate(module, val_loader, ckpt_path=fsdp_run / "train_end.ckpt")
    assert_identical(module.state_dict(), live_weights(fsdp_run))
    assert metrics["val_loss"] == expected["val_loss"]


def _single_device_trainer() -> Trainer:
    return Trainer(strategy="single_device", accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)


def test_a_full_state_dict_run_writes_one_plain_file_with_the_same_weights(fsdp_run, tmp_path):
    root = run_script(tmp_path / "full", "--state-dict-type", "full", "--max-steps", str(STEPS))
    checkpoint = torch.load(only_checkpoint(root), weights_only=True)
    assert_identical(checkpoint["module"], live_weights(fsdp_run))
    assert checkpoint["loops"]["fit"]["global_step"] == STEPS


def test_fsdp_spawn_fits_tests_and_predicts_from_the_calling_process(fsdp_run):
    trainer = Trainer(
        strategy="fsdp_spawn", accelerator="cpu", devices=2, max_steps=STEPS, logger=False,
        enable_progress_bar=False, enable_checkpointing=False, num_sanity_val_steps=0, seed=0,
    )  # fmt: skip
    train_loader, val_loader = demo_dataloaders(batch_size=16, num_samples=512)
    module = DemoModule(hidden=HIDDEN)
    trainer.fit(module, train_loader, val_loader)
    assert_identical(module.state_dict(), live_weights(fsdp_run))
    # The calling process got the weights back, but the optimizer state stayed with the workers.
    with pytest.raises(RuntimeError, match="hands the trained weights back here, but not the optimizer state"):
        trainer.save_checkpoint(fsdp_run / "from_the_caller.ckpt")
    assert not (fsdp_run / "from_the_caller.ckpt").exists()
    [metrics] = trainer.test(module, val_loader, ckpt_path=only_checkpoint(fsdp_run))
    assert set(metrics) == {"test_loss", "test_acc"}
    predictions = trainer.predict(module, val_loader, ckpt_path=only_checkpoint(fsdp_run))
    assert len(predictions) == len(val_loader) // 2


def test_stratagem_consolidate_writes_one_file_that_plain_torch_load_reads(fsdp_run, tmp_path):
    stratagem = Path(sys.executable).with_name("stratagem")
    destination = tmp_path / "full.pt"
    run(str(stratagem), "consolidate", str(only_checkpoint(fsdp_run)), str(destination), cwd=tmp_path)
    checkpoint = torch.load(destination, weights_only=True)
    assert_identical(checkpoint["module"], live_weights(fsdp_run))
    assert checkpoint["loops"]["fit"]["global_step"] == STEPS
