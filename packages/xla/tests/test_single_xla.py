"""single_xla on XLA's CPU device (PJRT_DEVICE=CPU) against the same run on plain CPU."""

from __future__ import annotations

import pytest
import torch
from stratagem_xla import SingleXLAStrategy
from xla_testing import Regression, loader, weights

from stratagem import Trainer

RUN = {"max_epochs": 2, "logger": False, "enable_progress_bar": False, "enable_checkpointing": False}


def _trainer(strategy: str, tmp_path, **options) -> Trainer:
    settings = {**RUN, "default_root_dir": tmp_path, "num_sanity_val_steps": 0, **options}
    if strategy == "single_device":
        settings["accelerator"] = "cpu"
    return Trainer(strategy=strategy, devices=1, **settings)


def _close(left: dict[str, torch.Tensor], right: dict[str, torch.Tensor], tolerance: float = 1e-5) -> None:
    assert left.keys() == right.keys()
    for name in left:
        torch.testing.assert_close(left[name], right[name], atol=tolerance, rtol=tolerance, msg=name)


def test_fit_validate_test_predict_on_single_xla_match_plain_cpu(tmp_path):
    results = {}
    for strategy in ("single_device", "single_xla"):
        module = Regression()
        trainer = _trainer(strategy, tmp_path / strategy)
        torch.manual_seed(7)
        trainer.fit(module, loader(shuffle=True), loader())
        results[strategy] = {
            "weights": weights(module),
            "fit_val": float(trainer.callback_metrics["val_loss"]),
            "validate": trainer.validate(module, loader())[0]["val_loss"],
            "test": trainer.test(module, loader())[0]["test_loss"],
            "predict": torch.cat([p.cpu() for p in trainer.predict(module, loader())]),
        }
    cpu, xla = results["single_device"], results["single_xla"]
    _close(cpu["weights"], xla["weights"])
    for key in ("fit_val", "validate", "test"):
        assert xla[key] == pytest.approx(cpu[key], rel=1e-5, abs=1e-6), key
    torch.testing.assert_close(xla["predict"], cpu["predict"], atol=1e-5, rtol=1e-5)
    assert results["single_device"]["weights"] != {}


def test_training_batches_arrive_on_the_xla_device_through_the_parallel_loader(tmp_path):
    module = Regression()
    trainer = _trainer("single_xla", tmp_path, max_epochs=1)
    trainer.fit(module, loader())
    assert module.batch_devices == ["xla"] * len(loader())
    assert trainer.strategy.root_device.type == "xla"


def test_a_single_xla_checkpoint_loads_into_single_device_with_identical_weights_and_loss(tmp_path):
    module = Regression()
    trainer = _trainer("single_xla", tmp_path / "xla")
    trainer.fit(module, loader())
    path = tmp_path / "xla.ckpt"
    trainer.save_checkpoint(path)
    trained, xla_loss = weights(module), trainer.validate(module, loader())[0]["val_loss"]
    written = torch.load(path, weights_only=True)
    assert {value.device.type for value in written["module"].values()} == {"cpu"}

    plain = Regression(lr=0.5)
    cpu_loss = _trainer("single_device", tmp_path / "cpu").validate(plain, loader(), ckpt_path=path)[0]["val_loss"]
    _close(weights(plain), trained, tolerance=0.0)
    assert cpu_loss == pytest.approx(xla_loss, rel=1e-6)


def test_a_single_device_checkpoint_resumes_on_single_xla_with_identical_weights(tmp_path):
    module = Regression()
    trainer = _trainer("single_device", tmp_path / "cpu")
    trainer.fit(module, loader())
    path = tmp_path / "cpu.ckpt"
    trainer.save_checkpoint(path)

    on_xla = Regression(lr=0.5)
    loss = _trainer("single_xla", tmp_path / "xla").validate(on_xla, loader(), ckpt_path=path)[0]["val_loss"]
    _close(weights(on_xla), weights(module), tolerance=0.0)
    assert loss == pytest.approx(trainer.validate(module, loader())[0]["val_loss"], rel=1e-6)

    resumed = Regression()
    xla_trainer = _trainer("single_xla", tmp_path / "resumed", max_epochs=3)
    xla_trainer.fit(resumed, loader(), ckpt_path=path)
    assert xla_trainer.global_step == 3 * len(loader())


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true"])
def test_bf16_trains_on_single_xla(tmp_path, precision):
    module = Regression()
    before = Trainer(strategy="single_xla", precision=precision, **{**RUN, "default_root_dir": tmp_path})
    first = before.validate(module, loader())[0]["val_loss"]
    before.fit(module, loader())
    after = before.validate(module, loader())[0]["val_loss"]
    assert after < first
    expected = torch.bfloat16 if precision == "bf16-true" else torch.float32
    assert all(parameter.dtype == expected for parameter in module.parameters())


@pytest.mark.parametrize("precision", ["16-mixed", "64-true"])
def test_precisions_xla_cannot_train_in_are_refused_when_the_trainer_is_created(precision):
    with pytest.raises(ValueError, match=precision):
        Trainer(strategy="single_xla", precision=precision, logger=False)


def test_single_xla_refuses_more_devices_than_the_runtime_has_and_more_than_one():
    with pytest.raises(ValueError, match="devices=2 asks for 2 xla device"):
        Trainer(strategy=SingleXLAStrategy(), devices=2, logger=False)
    with pytest.raises(ValueError, match="strategy='single_xla' runs on exactly one device"):
        Trainer(strategy=SingleXLAStrategy(), num_nodes=2, logger=False)
