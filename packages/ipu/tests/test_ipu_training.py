"""ipu_strategy through the PopTorch stand-in: the engine owns the step, data arrives combined, weights
reach the host, checkpoints load anywhere."""

import copy
import json
import os
import subprocess
import sys

import poptorch
import pytest
import torch
from torch.nn import functional
from torch.utils.data import DataLoader, TensorDataset

from stratagem import Module, Trainer
from stratagem_ipu import IPUStrategy

FEATURES = 4
SAMPLES = 64


class Regression(Module):
    def __init__(self, lr: float = 0.1, step_lr: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(FEATURES, 1)
        self.lr = lr
        self.step_lr = step_lr

    def training_step(self, batch, batch_idx):
        features, targets = batch
        loss = functional.mse_loss(self.net(features), targets)
        self.log("train_loss", loss)
        self.log("largest_loss", loss, reduce_fx="max")
        return loss

    def validation_step(self, batch, batch_idx):
        features, targets = batch
        self.log("val_loss", functional.mse_loss(self.net(features), targets))

    def test_step(self, batch, batch_idx):
        features, targets = batch
        self.log("test_loss", functional.mse_loss(self.net(features), targets))

    def predict_step(self, batch, batch_idx):
        return self.net(batch[0])

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        if not self.step_lr:
            return optimizer
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    features = torch.randn(SAMPLES, FEATURES, generator=generator)
    return TensorDataset(features, features.sum(dim=1, keepdim=True).sin())


def trainer(**options) -> Trainer:
    settings = {
        "strategy": "ipu_strategy",
        "accelerator": "ipu",
        "devices": 2,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "num_sanity_val_steps": 0,
    }
    settings.update(options)
    return Trainer(**settings)


def train_on_cpu(module: Regression, samples_per_step: int, steps: int, lrs=None) -> Regression:
    """Plain CPU training: each optimizer step on the mean loss of ``samples_per_step`` consecutive samples."""
    module = copy.deepcopy(module)
    optimizer = torch.optim.SGD(module.parameters(), lr=module.lr, momentum=0.9)
    features, targets = dataset().tensors
    for step in range(steps):
        if lrs is not None:
            for group in optimizer.param_groups:
                group["lr"] = lrs[step]
        window = slice(step * samples_per_step, (step + 1) * samples_per_step)
        optimizer.zero_grad()
        functional.mse_loss(module.net(features[window]), targets[window]).backward()
        optimizer.step()
    return module


@pytest.fixture(autouse=True)
def two_ipus(monkeypatch):
    # As many IPUs as one executor needs: an executor left attached makes the next attach fail.
    monkeypatch.setenv("POPTORCH_STANDIN_IPUS", "2")


@pytest.mark.parametrize(("device_iterations", "accumulate"), [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_weights_after_the_host_calls_equal_cpu_training_on_the_same_micro_batches(device_iterations, accumulate):
    module = Regression()
    start = copy.deepcopy(module)
    run = trainer(
        strategy=IPUStrategy(device_iterations=device_iterations), max_epochs=1, accumulate_grad_batches=accumulate
    )
    run.fit(module, DataLoader(dataset(), batch_size=4))
    samples_per_step = 4 * 2 * accumulate
    steps = SAMPLES // samples_per_step
    assert run.global_step == steps
    expected = train_on_cpu(start, samples_per_step, steps)
    for name, value in expected.state_dict().items():
        torch.testing.assert_close(module.state_dict()[name], value, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("device_iterations", "accumulate", "calls"), [(1, 1, 8), (2, 1, 4), (1, 2, 4), (2, 2, 2)])
def test_accumulation_and_device_iterations_divide_the_host_calls_as_poptorch_does(
    device_iterations, accumulate, calls, monkeypatch
):
    made = []
    original = poptorch.trainingModel

    def recording(*args, **kwargs):
        made.append(original(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(poptorch, "trainingModel", recording)
    run = trainer(
        strategy=IPUStrategy(device_iterations=device_iterations), max_epochs=1, accumulate_grad_batches=accumulate
    )
    run.fit(Regression(), DataLoader(dataset(), batch_size=4))
    assert made[0].calls == calls
    assert run.global_step == calls * device_iterations
    assert run.num_training_batches == calls


def test_the_trainer_hands_a_scheduler_s_learning_rate_to_the_engine_before_each_call():
    module = Regression(step_lr=True)
    start = copy.deepcopy(module)
    run = trainer(max_epochs=1)
    run.fit(module, DataLoader(dataset(), batch_size=4))
    steps = SAMPLES // 8
    expected = train_on_cpu(start, 8, steps, lrs=[0.1 * 0.5**step for step in range(steps)])
    for name, value in expected.state_dict().items():
        torch.testing.assert_close(module.state_dict()[name], value, rtol=1e-5, atol=1e-6)


def test_values_logged_in_the_compiled_step_are_reduced_over_its_micro_batches():
    module = Regression(lr=0.0)
    run = trainer(max_steps=1, accumulate_grad_batches=2)
    run.fit(module, DataLoader(dataset(), batch_size=4))
    features, targets = dataset().tensors
    losses = [functional.mse_loss(module.net(features[i : i + 4]), targets[i : i + 4]).item() for i in range(0, 16, 4)]
    assert run.callback_metrics["train_loss"].item() == pytest.approx(sum(losses) / 4, rel=1e-6)
    assert run.callback_metrics["largest_loss"].item() == pytest.approx(max(losses), rel=1e-6)


def test_validate_test_and_predict_run_through_inference_models_on_combined_batches():
    module = Regression()
    run = trainer(max_epochs=1)
    run.fit(module, DataLoader(dataset(), batch_size=4), DataLoader(dataset(), batch_size=4))
    features, targets = dataset().tensors
    with torch.no_grad():
        expected = functional.mse_loss(module.net(features), targets).item()
    assert run.validate(module, DataLoader(dataset(), batch_size=4))[0]["val_loss"] == pytest.approx(expected, rel=1e-5)
    assert run.test(module, DataLoader(dataset(), batch_size=4))[0]["test_loss"] == pytest.approx(expected, rel=1e-5)
    predictions = run.predict(module, DataLoader(dataset(), batch_size=4))
    assert [tuple(batch.shape) for batch in predictions] == [(8, 1)] * (SAMPLES // 8)
    with torch.no_grad():
        torch.testing.assert_close(torch.cat(predictions), module.net(features))


def test_the_checkpoint_holds_the_trained_weights_and_validates_alike_under_single_device(tmp_path):
    module = Regression()
    run = trainer(max_epochs=1)
    run.fit(module, DataLoader(dataset(), batch_size=4))
    path = tmp_path / "ipu.ckpt"
    run.save_checkpoint(path)
    ipu_loss = run.validate(module, DataLoader(dataset(), batch_size=4))[0]["val_loss"]
    fresh = Regression()
    single = Trainer(strategy="single_device", accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    cpu_loss = single.validate(fresh, DataLoader(dataset(), batch_size=8), ckpt_path=path)[0]["val_loss"]
    assert cpu_loss == pytest.approx(ipu_loss, rel=1e-5)
    for name, value in module.state_dict().items():
        torch.testing.assert_close(fresh.state_dict()[name], value)


def test_a_checkpoint_saved_mid_fit_holds_the_device_weights_not_the_stale_host_copy(tmp_path):
    saved = {}

    class SaveAfterFirstCall(Regression):
        def on_train_batch_end(self, outputs, batch, batch_idx):
            if batch_idx == 0:
                self.trainer.save_checkpoint(tmp_path / "first.ckpt")
                saved.update({key: value.clone() for key, value in self.state_dict().items()})

    module = SaveAfterFirstCall()
    start = copy.deepcopy(module)
    trainer(max_epochs=1).fit(module, DataLoader(dataset(), batch_size=4))
    expected = train_on_cpu(start, 8, 1)
    checkpoint = torch.load(tmp_path / "first.ckpt", weights_only=True)
    for name, value in expected.state_dict().items():
        torch.testing.assert_close(checkpoint["module"][name], value, rtol=1e-5, atol=1e-6)
        assert not torch.equal(value, start.state_dict()[name])


@pytest.mark.parametrize("precision", ["16-true", "16-mixed"])
def test_half_precisions_train_to_a_finite_loss(precision):
    run = trainer(max_epochs=1, precision=precision)
    run.fit(Regression(), DataLoader(dataset(), batch_size=4))
    assert torch.isfinite(run.callback_metrics["train_loss"])
    assert run.strategy.precision.name == precision


def test_autoreport_asks_poplar_for_reports_in_the_directory_and_restores_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("POPLAR_ENGINE_OPTIONS", raising=False)
    strategy = IPUStrategy(autoreport=True, autoreport_dir=tmp_path / "reports")
    trainer(strategy=strategy, max_steps=1).fit(Regression(), DataLoader(dataset(), batch_size=4))
    reports = list((tmp_path / "reports").glob("training_*.json"))
    assert len(reports) == 1
    assert json.loads(reports[0].read_text())["replication_factor"] == 2
    assert "POPLAR_ENGINE_OPTIONS" not in os.environ


def test_a_detached_model_refuses_to_run():
    model = poptorch.inferenceModel(torch.nn.Linear(2, 1))
    model(torch.ones(1, 2))
    model.detachFromDevice()
    with pytest.raises(RuntimeError, match="detached"):
        model(torch.ones(1, 2))


def test_the_demo_trains_on_ipus_and_its_checkpoint_resumes_under_single_device(tmp_path):
    def demo(*arguments):
        command = [sys.executable, "-m", "stratagem.cli.main", "demo", "--max-steps", "20", *arguments]
        return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=True)

    trained = demo("--strategy", "ipu_strategy", "--accelerator", "ipu", "--batch-size", "16")
    assert "IPUStrategy(" in trained.stdout
    assert "lr_scheduler.step()" not in trained.stderr
    (checkpoint,) = tmp_path.glob("stratagem_demo/checkpoints/version_0/*.ckpt")
    resumed = demo("--strategy", "single_device", "--max-steps", "25", "--ckpt-path", str(checkpoint))
    assert "done after 25 steps" in resumed.stdout


def test_a_single_device_checkpoint_validates_alike_under_ipu_strategy(tmp_path):
    module = Regression()
    single = Trainer(
        strategy="single_device",
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
    )
    single.fit(module, DataLoader(dataset(), batch_size=8))
    single.save_checkpoint(tmp_path / "cpu.ckpt")
    cpu_loss = single.validate(module, DataLoader(dataset(), batch_size=8))[0]["val_loss"]
    ipu_loss = trainer().validate(Regression(), DataLoader(dataset(), batch_size=4), ckpt_path=tmp_path / "cpu.ckpt")
    assert ipu_loss[0]["val_loss"] == pytest.approx(cpu_loss, rel=1e-5)


def test_a_poptorch_dataloader_of_the_user_is_used_when_it_combines_as_the_strategy_does():
    options = poptorch.Options().replicationFactor(2)
    run = trainer(max_epochs=1)
    run.fit(Regression(), poptorch.DataLoader(options, dataset(), batch_size=4))
    assert run.global_step == SAMPLES // 8
    mismatched = poptorch.Options().replicationFactor(2).deviceIterations(2)
    with pytest.raises(ValueError, match=r"built with device_iterations=2, but ipu_strategy runs with device_iter"):
        trainer(max_epochs=1).fit(Regression(), poptorch.DataLoader(mismatched, dataset(), batch_size=4))
