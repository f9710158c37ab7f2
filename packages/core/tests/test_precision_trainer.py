"""Every precision CPU supports runs fit/validate/test/predict; the others fail at construction."""

import math

import pytest
import torch
from torch.nn import functional
from trainer_testing import ClassifierModule, make_loader, quiet_trainer

import stratagem
from stratagem.accelerators.cpu import CPUAccelerator

# name -> (dtype of the parameters, dtype the forward computes in)
CPU_PRECISIONS = {
    "32-true": (torch.float32, torch.float32),
    "64-true": (torch.float64, torch.float64),
    "bf16-mixed": (torch.float32, torch.bfloat16),
    "16-mixed": (torch.float32, torch.float16),
    "bf16-true": (torch.bfloat16, torch.bfloat16),
    "16-true": (torch.float16, torch.float16),
}


class _Probe(ClassifierModule):
    def __init__(self):
        super().__init__(optimizer="sgd", lr=0.05)
        self.seen = {}

    def training_step(self, batch, batch_idx):
        features, labels = batch
        logits = self(features)
        self.seen["train"] = (self.layers[0].weight.dtype, logits.dtype)
        return functional.cross_entropy(logits.float(), labels)

    def validation_step(self, batch, batch_idx, *args):
        self.seen["validation"] = self(batch[0]).dtype
        super().validation_step(batch, batch_idx)


@pytest.mark.parametrize("precision", list(CPU_PRECISIONS))
def test_every_cpu_precision_runs_fit_validate_test_and_predict(tmp_path, precision):
    param_dtype, compute_dtype = CPU_PRECISIONS[precision]
    trainer = quiet_trainer(tmp_path, precision=precision, max_epochs=2)
    module = _Probe()
    trainer.fit(module, make_loader(), make_loader())
    assert trainer.strategy.precision.name == precision
    assert module.seen["train"] == (param_dtype, compute_dtype)
    assert module.seen["validation"] == compute_dtype
    assert math.isfinite(float(trainer.callback_metrics["val_loss"]))
    (validated,) = trainer.validate(module, make_loader())
    (tested,) = trainer.test(module, make_loader())
    assert math.isfinite(validated["val_loss"])
    assert math.isfinite(tested["test_loss"])
    predictions = trainer.predict(module, make_loader(num_samples=16))
    assert [p.shape for p in predictions] == [torch.Size([8]), torch.Size([8])]


@pytest.mark.parametrize(
    ("short", "full"), [(32, "32-true"), (64, "64-true"), (16, "16-mixed"), ("bf16", "bf16-mixed")]
)
def test_short_precision_names_mean_their_full_form(tmp_path, short, full):
    assert quiet_trainer(tmp_path, precision=short).strategy.precision.name == full


def test_16_mixed_on_cpu_scales_the_loss_and_keeps_the_scaler_in_checkpoints(tmp_path):
    trainer = quiet_trainer(tmp_path, precision="16-mixed", max_steps=3)
    scaler = trainer.strategy.precision.scaler
    assert isinstance(scaler, torch.amp.GradScaler)
    trainer.fit(ClassifierModule(), make_loader())
    assert trainer.strategy.precision.state_dict()["scaler"]["scale"] == 2.0**16


def test_with_several_optimizers_the_scale_is_updated_once_per_step(tmp_path):
    class TwoOptimizers(ClassifierModule):
        def configure_optimizers(self):
            return [
                torch.optim.SGD(self.layers[0].parameters(), lr=0.1),
                torch.optim.SGD(self.layers[3].parameters(), lr=0.1),
            ]

    trainer = quiet_trainer(tmp_path, precision="16-mixed", max_steps=3, gradient_clip_val=1.0)
    trainer.fit(TwoOptimizers(), make_loader())
    assert trainer.strategy.precision.state_dict()["scaler"]["_growth_tracker"] == 3


class _NoHalfCPU(CPUAccelerator):
    """A CPU whose torch build lacks fp16 autocast, as older builds did."""

    def supports_autocast(self, dtype):
        return dtype != torch.float16


class _NoAutocastCPU(CPUAccelerator):
    def supports_autocast(self, dtype):
        return False


class _MPSLike(CPUAccelerator):
    device_type = "mps"


def test_a_precision_the_device_cannot_run_fails_at_construction_saying_what_would_work():
    with pytest.raises(ValueError, match=r"precision='16-mixed' needs torch.float16 autocast.*use 'bf16-mixed' or"):
        stratagem.Trainer(accelerator=_NoHalfCPU(), precision="16-mixed")
    with pytest.raises(ValueError, match=r"precision='bf16-mixed' needs torch.bfloat16 autocast.*use '32-true'"):
        stratagem.Trainer(accelerator=_NoAutocastCPU(), precision="bf16-mixed")
    with pytest.raises(ValueError, match=r"precision='64-true' is not supported on MPS"):
        stratagem.Trainer(accelerator=_MPSLike(), precision="64-true")


def test_16_true_refuses_an_adam_whose_eps_rounds_to_zero_in_float16_before_the_first_step(tmp_path):
    module = ClassifierModule(optimizer="adam", lr=0.05)
    trainer = quiet_trainer(tmp_path, precision="16-true", max_steps=3)
    with pytest.raises(ValueError, match=r"eps=1e-08 \(param group 0\) rounds to 0.*eps=1e-4") as raised:
        trainer.fit(module, make_loader())
    assert "16-true" in str(raised.value)
    assert trainer.global_step == 0


def test_16_true_with_an_eps_float16_can_hold_trains_to_a_finite_loss(tmp_path):
    class _AdamWithLargerEps(ClassifierModule):
        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=0.05, eps=1e-4)

    module = _AdamWithLargerEps()
    trainer = quiet_trainer(tmp_path, precision="16-true", max_steps=8)
    trainer.fit(module, make_loader())
    assert math.isfinite(float(trainer.callback_metrics["train_loss"]))
    assert all(torch.isfinite(parameter).all() for parameter in module.parameters())
