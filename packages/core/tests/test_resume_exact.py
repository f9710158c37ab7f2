"""Fitting N steps, stopping, and resuming to the end gives the weights of one uninterrupted run, bit for bit."""

import pytest
import torch
from trainer_testing import ClassifierModule, assert_bitwise_equal, make_loader, parameters_of, quiet_trainer

from stratagem.callbacks import ModelCheckpoint

TOTAL_STEPS = 20  # 64 samples in batches of 8: two and a half epochs


def _module(seed: int) -> ClassifierModule:
    torch.manual_seed(seed)

    def scheduler(optimizer):
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)

    return ClassifierModule(dropout=0.3, optimizer="adam", lr=0.01, scheduler=scheduler)


def _fit(root, max_steps, ckpt_path=None, module_seed=0, **options):
    """Shuffled data, dropout, Adam, an epoch scheduler, and validation in the middle of epochs."""
    module = _module(module_seed)
    checkpoint = ModelCheckpoint(dirpath=root / "checkpoints", save_last=True, every_n_train_steps=5)
    trainer = quiet_trainer(
        root,
        max_steps=max_steps,
        seed=0,
        enable_checkpointing=True,
        callbacks=[checkpoint],
        val_check_interval=0.5,
        num_sanity_val_steps=1,
        **options,
    )
    trainer.fit(module, make_loader(shuffle=True), make_loader(num_samples=16), ckpt_path=ckpt_path)
    return trainer, module


@pytest.mark.parametrize(
    ("stop_at", "options"),
    [
        pytest.param(11, {}, id="middle-of-an-epoch"),
        pytest.param(16, {}, id="end-of-an-epoch"),
        pytest.param(3, {"accumulate_grad_batches": 2}, id="accumulating-in-the-middle-of-an-epoch"),
        pytest.param(13, {"precision": "16-mixed", "gradient_clip_val": 0.5}, id="fp16-with-scaler-and-clipping"),
        pytest.param(7, {"precision": "bf16-true"}, id="bf16-true"),
    ],
)
def test_resuming_from_a_checkpoint_matches_an_uninterrupted_run_bitwise(tmp_path, stop_at, options):
    _, uninterrupted = _fit(tmp_path / "whole", TOTAL_STEPS, **options)

    interrupted_trainer, _ = _fit(tmp_path / "parts", stop_at, **options)
    assert interrupted_trainer.global_step == stop_at
    resumed_trainer, resumed = _fit(tmp_path / "parts", TOTAL_STEPS, ckpt_path="last", module_seed=1, **options)

    assert resumed_trainer.global_step == TOTAL_STEPS
    assert_bitwise_equal(parameters_of(resumed), parameters_of(uninterrupted))
    whole_optimizer = uninterrupted.trainer.optimizers[0].state_dict()
    resumed_optimizer = resumed_trainer.optimizers[0].state_dict()
    for index, state in whole_optimizer["state"].items():
        assert_bitwise_equal(state, resumed_optimizer["state"][index])
    assert whole_optimizer["param_groups"] == resumed_optimizer["param_groups"]


def test_resuming_from_one_checkpoint_twice_gives_the_same_weights(tmp_path):
    trainer, _ = _fit(tmp_path, 12)
    saved = trainer.checkpoint_callback.best_model_path
    assert saved == str(tmp_path / "checkpoints" / "epoch=1-step=12.ckpt")
    _, first = _fit(tmp_path / "a", 18, ckpt_path=saved)
    _, second = _fit(tmp_path / "b", 18, ckpt_path=saved)
    assert_bitwise_equal(parameters_of(first), parameters_of(second))


def test_resume_restores_progress_and_continues_counting(tmp_path):
    _fit(tmp_path, 11)
    trainer, _ = _fit(tmp_path, 14, ckpt_path="last")
    assert (trainer.global_step, trainer.current_epoch, trainer.fit_progress.batches_in_epoch) == (14, 1, 6)
    assert trainer.throughput.steps == 3


def test_last_without_any_checkpoint_trains_from_scratch_with_a_warning(tmp_path):
    with pytest.warns(UserWarning, match="found no checkpoint .* training from scratch"):
        trainer, _ = _fit(tmp_path, 2, ckpt_path="last")
    assert trainer.global_step == 2


def test_resuming_with_less_data_than_the_checkpoint_read_is_refused(tmp_path):
    _fit(tmp_path, 7)
    trainer = quiet_trainer(tmp_path, max_steps=20)
    with pytest.raises(ValueError, match="resumes after batch 7 of epoch 0, but the training data has only 2"):
        trainer.fit(_module(0), make_loader(num_samples=16), ckpt_path=tmp_path / "checkpoints" / "last.ckpt")
