import argparse
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from stratagem.cli import demo
from stratagem.demo import DemoModule, demo_dataloaders, make_classification

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "train.py"


def _run_demo(*argv):
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    return demo.run(parser.parse_args(list(argv)))


def test_the_demo_trains_prints_its_result_and_saves_a_checkpoint(tmp_path, capsys):
    assert _run_demo("--max-steps", "40", "--root-dir", str(tmp_path), "--precision", "bf16-mixed") == 0
    captured = capsys.readouterr()
    output = captured.out
    assert captured.err.startswith("stratagem: DemoModule: 21,252 parameters (21,252 trainable)")
    setup, summary = output.strip().splitlines()[0], output.strip().splitlines()[-1]
    assert setup == (
        "stratagem demo: SingleDeviceStrategy(device='cpu'), precision bf16-mixed, 1 process; "
        f"checkpoints go to {tmp_path / 'checkpoints' / 'version_0'}"
    )
    assert summary.startswith("done after 40 steps: train_loss ")
    assert re.search(r" steps/s \| [\d,]+ samples/s \| peak memory [\d,]+ MiB \| checkpoint ", summary), summary
    checkpoint = tmp_path / "checkpoints" / "version_0" / "epoch=0-step=40.ckpt"
    assert f"checkpoint {checkpoint}" in summary
    assert torch.load(checkpoint, weights_only=True)["loops"]["fit"]["global_step"] == 40
    header = (tmp_path / "csv_logs" / "version_0" / "metrics.csv").read_text().splitlines()[0]
    assert "lr-AdamW" in header.split(",")


def test_the_demo_trains_to_a_finite_loss_in_16_true(tmp_path, capsys):
    assert (
        _run_demo("--max-steps", "30", "--root-dir", str(tmp_path), "--precision", "16-true", "--logger", "none") == 0
    )
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    loss = float(summary.split("train_loss ")[1].split()[0])
    assert math.isfinite(loss), summary


def test_the_summary_counts_one_step_in_the_singular(tmp_path, capsys):
    assert _run_demo("--max-steps", "1", "--root-dir", str(tmp_path), "--logger", "none") == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("done after 1 step: ")


def test_the_demo_resumes_from_the_last_checkpoint_says_so_and_keeps_the_previous_runs(tmp_path, capsys):
    _run_demo("--max-steps", "20", "--root-dir", str(tmp_path), "--logger", "none", "--precision", "bf16-mixed")
    first = tmp_path / "checkpoints" / "version_0" / "epoch=0-step=20.ckpt"
    saved = first.read_bytes()
    capsys.readouterr()
    assert _run_demo("--max-steps", "30", "--root-dir", str(tmp_path), "--ckpt-path", "last", "--logger", "none") == 0
    output = capsys.readouterr()
    assert output.out.strip().splitlines()[-1].startswith("done after 30 steps")
    resumed = (
        f"stratagem: resuming from {first} (epoch 0, step 20); "
        "it was saved with precision bf16-mixed, this run uses precision 32-true"
    )
    # Besides the model summary's lines, which come first.
    lines = output.err.strip().splitlines()
    assert [line for line in lines if "resuming" in line] == [resumed]
    assert any(line.startswith("stratagem: DemoModule: 21,252 parameters") for line in lines)
    assert first.read_bytes() == saved
    assert (tmp_path / "checkpoints" / "version_1" / "epoch=0-step=30.ckpt").is_file()


def test_a_bad_option_is_reported_without_a_traceback(tmp_path, capsys):
    assert _run_demo("--precision", "8-true", "--root-dir", str(tmp_path)) == 2
    assert "stratagem demo: precision='8-true' is not valid" in capsys.readouterr().err


@pytest.mark.parametrize(("name", "suggestion"), [("slurm", ""), ("asyn", "Did you mean 'async'\\? ")])
def test_a_checkpoint_io_that_is_not_one_is_refused_listing_the_registered_ones(tmp_path, capsys, name, suggestion):
    assert _run_demo("--checkpoint-io", name, "--root-dir", str(tmp_path)) == 2
    expected = rf"stratagem demo: --checkpoint-io '{name}' is not valid: Unknown checkpoint IO '{name}'\. {suggestion}"
    assert re.search(expected + r"Registered checkpoint IO names: async, .*torch", capsys.readouterr().err)
    assert not any(tmp_path.iterdir()), "nothing ran"


def test_the_synthetic_data_is_fixed_and_learnable():
    first, second = make_classification(64), make_classification(64)
    assert torch.equal(first.tensors[0], second.tensors[0])
    assert set(first.tensors[1].tolist()) <= {0, 1, 2, 3}
    train, val = demo_dataloaders(batch_size=32, num_samples=256)
    assert (len(train.dataset), len(val.dataset)) == (224, 32)
    module = DemoModule()
    module.configure_model()
    assert module(first.tensors[0]).shape == (64, 4)


@pytest.mark.slow
def test_the_example_script_runs_the_same_job(tmp_path):
    completed = subprocess.run(
        [sys.executable, str(EXAMPLE), "--max-steps", "20", "--root-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert "final train loss" in completed.stdout
    assert (tmp_path / "checkpoints" / "version_0" / "epoch=0-step=20.ckpt").is_file()


def test_the_demo_shows_the_learning_rate_in_tensorboard(tmp_path, capsys):
    pytest.importorskip("tensorboard", reason="TensorBoard is optional: pip install 'stratagem[tensorboard]'")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert _run_demo("--max-steps", "100", "--root-dir", str(tmp_path), "--logger", "tensorboard") == 0
    events = EventAccumulator(str(tmp_path / "tensorboard_logs" / "version_0"))
    events.Reload()
    assert [event.step for event in events.Scalars("lr-AdamW")] == [0, 50]
