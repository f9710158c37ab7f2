"""The Trainer under ddp, ddp_spawn and ddp_fork gives what single-device training gives, and more ways to start.

Each strategy runs ``ddp_job.py`` once as a script (fit, evaluate, load a single-device
checkpoint, resume), the way users start training; the single-device reference runs in this
process. Every run sees the same 16 samples per optimizer step.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import ddp_job
import pytest
import torch

import stratagem

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]

JOB = Path(__file__).with_name("ddp_job.py")
STRATEGIES = ["ddp", "ddp_spawn", "ddp_fork"]


def _environment(**extra):
    environment = {key: value for key, value in os.environ.items() if key not in ("LOCAL_RANK", "MASTER_PORT")}
    return {**environment, "OMP_NUM_THREADS": "1", **extra}


def _read(out, name):
    return json.loads((Path(out) / f"{name}.json").read_text())


def _weights(out, name):
    return torch.load(Path(out) / f"{name}.pt", weights_only=True)


def _assert_weights_close(actual, expected):
    assert actual.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("single_device")
    common = ["--strategy", "single_device", "--devices", "1", "--out", str(out)]
    ddp_job.run(ddp_job.parse([*common, "--scenarios", "fit,evaluate"]))
    ddp_job.run(ddp_job.parse([*common, "--scenarios", "load", "--load", _read(out, "fit")["checkpoint"]]))
    return out


@pytest.fixture(scope="module", params=STRATEGIES)
def run(request, reference, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param)
    command = [sys.executable, str(JOB), "--strategy", request.param, "--out", str(out)]
    command += ["--scenarios", "fit,evaluate,load,resume", "--load", _read(reference, "fit")["checkpoint"]]
    completed = subprocess.run(command, env=_environment(), capture_output=True, text=True, timeout=240)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return out


def test_fit_weights_match_single_device_training_on_the_same_global_batch(run, reference):
    _assert_weights_close(_weights(run, "fit"), _weights(reference, "fit"))


def test_fit_hands_progress_and_synced_metrics_back_to_the_caller(run, reference):
    fit, expected = _read(run, "fit"), _read(reference, "fit")
    assert fit["global_step"] == expected["global_step"] == ddp_job.MAX_STEPS
    metrics = fit["callback_metrics"]
    assert metrics["val_loss"] == pytest.approx(expected["callback_metrics"]["val_loss"], rel=1e-5)
    # Logged with sync_dist=True: the mean of the ranks 0 and 1.
    assert metrics["mean_rank"] == 0.5


def test_validate_test_and_predict_match_single_device(run, reference):
    evaluated, expected = _read(run, "evaluate"), _read(reference, "evaluate")
    assert evaluated["validate"][0]["val_loss"] == pytest.approx(expected["validate"][0]["val_loss"], rel=1e-5)
    assert evaluated["validate"][0]["mean_rank"] == 0.5
    assert evaluated["test"][0]["test_loss"] == pytest.approx(expected["test"][0]["test_loss"], rel=1e-5)
    assert evaluated["test"][0]["max_rank"] == 1.0
    # Rank 0 predicts its share: every second sample.
    assert evaluated["predictions"] == pytest.approx(expected["predictions"][0::2], rel=1e-5)


def test_a_single_device_checkpoint_loads_under_ddp(run, reference):
    assert _read(run, "load")["validate"][0]["val_loss"] == pytest.approx(
        _read(reference, "load")["validate"][0]["val_loss"], rel=1e-5
    )


def test_a_ddp_checkpoint_loads_under_single_device(run, tmp_path):
    module = ddp_job.Regression()
    trainer = stratagem.Trainer(
        strategy="single_device", accelerator="cpu", default_root_dir=tmp_path, logger=False, enable_progress_bar=False
    )
    trainer.validate(module, ddp_job.loader(32, 2, 1), ckpt_path=_read(run, "fit")["checkpoint"])
    for key, value in _weights(run, "fit").items():
        assert torch.equal(module.state_dict()[key], value)


def test_save_checkpoint_after_fit_gives_the_same_loss_under_single_device_or_says_why_it_cannot(run, tmp_path):
    fit = _read(run, "fit")
    saved = Path(run) / "after_fit.ckpt"
    if fit["strategy"] != "ddp":
        # The calling process of a spawned run got the weights back, not the optimizer state.
        assert "hands the trained weights back here, but not the optimizer state" in fit["save_after_fit"]
        assert not saved.exists()
        return
    assert fit["save_after_fit"] is None
    trained = ddp_job.Regression()
    trained.load_state_dict(_weights(run, "fit"))
    [expected] = _single_device_trainer(tmp_path).validate(trained, ddp_job.loader(32, 2, 1))
    module = ddp_job.Regression()
    [metrics] = _single_device_trainer(tmp_path).validate(module, ddp_job.loader(32, 2, 1), ckpt_path=saved)
    assert metrics["val_loss"] == expected["val_loss"]
    for key, value in _weights(run, "fit").items():
        assert torch.equal(module.state_dict()[key], value)


def _single_device_trainer(root):
    return stratagem.Trainer(
        strategy="single_device", accelerator="cpu", default_root_dir=root, logger=False, enable_progress_bar=False
    )


def test_resume_from_a_mid_run_checkpoint_continues_exactly(run):
    assert _read(run, "resume")["resumed_from"].endswith(f"step={ddp_job.RESUME_AT}.ckpt")
    resumed, uninterrupted = _weights(run, "resume"), _weights(run, "fit")
    for key in uninterrupted:
        assert torch.equal(resumed[key], uninterrupted[key])


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def test_two_nodes_on_one_machine_train_together(reference, tmp_path):
    port = _free_port()
    command = [sys.executable, str(JOB), "--strategy", "ddp", "--devices", "1", "--num-nodes", "2"]
    command += ["--out", str(tmp_path)]
    nodes = [
        subprocess.Popen(
            command,
            env=_environment(NODE_RANK=str(node), MASTER_ADDR="127.0.0.1", MASTER_PORT=port),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in (0, 1)
    ]
    outputs = [node.communicate(timeout=240)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    _assert_weights_close(_weights(tmp_path, "fit"), _weights(reference, "fit"))


@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_torchrun_ranks_join_through_the_torchelastic_environment(reference, tmp_path, strategy):
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone", str(JOB)]
    command += ["--strategy", strategy, "--devices", "2", "--out", str(tmp_path), "--scenarios", "fit,evaluate"]
    completed = subprocess.run(command, env=_environment(), capture_output=True, text=True, timeout=240)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    _assert_weights_close(_weights(tmp_path, "fit"), _weights(reference, "fit"))
    assert _read(tmp_path, "evaluate")["validate"][0]["mean_rank"] == 0.5


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_demo_trains_on_two_processes_with_one_progress_display_and_no_c10d_warnings(strategy, tmp_path):
    command = [sys.executable, "-m", "stratagem.cli.main", "demo", "--strategy", strategy, "--devices", "2"]
    command += ["--max-steps", "30", "--root-dir", str(tmp_path), "--logger", "none"]
    completed = subprocess.run(command, env=_environment(), capture_output=True, text=True, timeout=240, cwd=tmp_path)
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output
    assert output.count("done after 30 steps") == 1, output
    assert output.count("stratagem demo: DDPStrategy(devices=2") == 1, output
    assert output.count("trained 30 steps") == 1, output
    # The rendezvous polls its store: a timed-out store wait would print c10d's socket warnings.
    assert "[c10d]" not in output, output
