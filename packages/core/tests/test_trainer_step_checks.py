"""A training step that would corrupt the weights or never end the run is caught where it happens, on one process.

(Ranks that disagree on a step are checked in ``test_trainer_distributed.py`` and, for ddp, fsdp and deepspeed, in
``integration_tests/test_step_agreement.py``.)
"""

import math

import pytest
import torch
from trainer_testing import ClassifierModule, assert_bitwise_equal, make_loader, parameters_of, quiet_trainer

from stratagem.callbacks import ModelCheckpoint

BAD_BATCH = 3


class BadLossAt(ClassifierModule):
    """Returns a loss of ``value`` (NaN or infinite) for batch ``BAD_BATCH`` of every epoch."""

    def __init__(self, value: float = math.nan) -> None:
        super().__init__()
        self.value = value

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * self.value if batch_idx == BAD_BATCH else loss


class BadGradientAt(ClassifierModule):
    """A finite loss whose gradient is NaN for batch ``BAD_BATCH``: d/dw sqrt(|0 * w|) is inf * 0."""

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        if batch_idx == BAD_BATCH:
            loss = loss + (self.layers[0].weight * 0).abs().sqrt().sum()
        return loss


def _weights_after(root, steps):
    torch.manual_seed(0)
    module = ClassifierModule()
    quiet_trainer(root, max_steps=steps).fit(module, make_loader())
    return parameters_of(module)


def _all_finite(module):
    return all(torch.isfinite(value).all() for value in module.state_dict().values())


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_a_non_finite_loss_stops_the_run_at_its_step_with_the_weights_and_checkpoint_of_the_step_before(
    tmp_path, value
):
    torch.manual_seed(0)
    module = BadLossAt(value)
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=1, save_top_k=-1)
    trainer = quiet_trainer(tmp_path, max_steps=6, enable_checkpointing=True, callbacks=[saver])
    with pytest.raises(RuntimeError) as caught:
        trainer.fit(module, make_loader())
    message = str(caught.value)
    assert f"non-finite loss ({value * 0 if math.isnan(value) else value})" in message
    assert f"at batch_idx {BAD_BATCH} of epoch 0 (global_step {BAD_BATCH})" in message
    assert "nonfinite='skip'" in message
    expected = _weights_after(tmp_path / "reference", BAD_BATCH)
    assert_bitwise_equal(parameters_of(module), expected)
    last = torch.load(saver.best_model_path, weights_only=True)
    assert last["loops"]["fit"]["global_step"] == BAD_BATCH
    assert_bitwise_equal(last["module"], expected)


def test_nonfinite_skip_skips_the_batch_with_a_warning_and_trains_on(tmp_path):
    module = BadLossAt()
    trainer = quiet_trainer(tmp_path, max_epochs=1, nonfinite="skip")
    with pytest.warns(RuntimeWarning, match=f"Skipped the batch: .* at batch_idx {BAD_BATCH} of epoch 0"):
        trainer.fit(module, make_loader())
    assert trainer.global_step == 7
    assert _all_finite(module)


def test_nonfinite_ignore_checks_nothing(tmp_path):
    module = BadLossAt()
    trainer = quiet_trainer(tmp_path, max_epochs=1, nonfinite="ignore")
    trainer.fit(module, make_loader())
    assert trainer.global_step == 8
    assert not _all_finite(module)


def test_a_non_finite_gradient_norm_computed_for_clipping_stops_the_run_before_the_optimizer_step(tmp_path):
    torch.manual_seed(0)
    module = BadGradientAt()
    trainer = quiet_trainer(tmp_path, max_steps=6, gradient_clip_val=100.0)
    with pytest.raises(RuntimeError, match=f"gradient norm is nan at batch_idx {BAD_BATCH} of epoch 0"):
        trainer.fit(module, make_loader())
    assert trainer.global_step == BAD_BATCH
    assert _all_finite(module)


def test_nonfinite_skip_drops_the_gradients_of_a_step_whose_norm_is_not_finite(tmp_path):
    module = BadGradientAt()
    trainer = quiet_trainer(tmp_path, max_epochs=1, gradient_clip_val=100.0, nonfinite="skip")
    with pytest.warns(
        RuntimeWarning, match=f"Skipped the optimizer step: the gradient norm is nan at batch_idx {BAD_BATCH}"
    ):
        trainer.fit(module, make_loader())
    assert trainer.global_step == 7
    assert _all_finite(module)


@pytest.mark.timeout(30)
def test_an_epoch_without_an_optimizer_step_ends_a_max_steps_run_with_a_message(tmp_path):
    class NeverALoss(ClassifierModule):
        def training_step(self, batch, batch_idx):
            return None

    trainer = quiet_trainer(tmp_path, max_steps=5)
    with pytest.raises(RuntimeError, match="Epoch 0 made no optimizer step in 8 batches: training_step returned None"):
        trainer.fit(NeverALoss(), make_loader())


@pytest.mark.parametrize("value", ["raise", None, True])
def test_nonfinite_names_what_it_accepts(tmp_path, value):
    with pytest.raises(ValueError, match=f"nonfinite={value!r} is not valid; expected 'error'.*'skip'.*'ignore'"):
        quiet_trainer(tmp_path, nonfinite=value)


def test_a_gradient_scaler_keeps_skipping_its_own_overflowing_steps(tmp_path):
    class Overflows(ClassifierModule):
        # Finite in fp32, infinite once the scaler multiplies it by its initial scale (2**16): the first steps
        # overflow until the scaler has lowered its scale.
        def training_step(self, batch, batch_idx):
            return super().training_step(batch, batch_idx) * 1e34

    module = Overflows()
    trainer = quiet_trainer(tmp_path, max_steps=6, precision="16-mixed", gradient_clip_val=1.0)
    trainer.fit(module, make_loader())
    assert trainer.global_step == 6
    assert trainer.strategy.precision.scaler.get_scale() < 2.0**16
    assert _all_finite(module)
