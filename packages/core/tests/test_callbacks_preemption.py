"""Preemption: a signal during training leads to a checkpoint at the next step and a clean return from fit, from
which ckpt_path="last" resumes exactly. (Across hosts, with the signal reaching one host, and under SLURM with
requeue: integration_tests/multihost.)"""

import os
import signal

import pytest
import torch
from trainer_testing import ClassifierModule, assert_bitwise_equal, make_loader, parameters_of, quiet_trainer

from stratagem.callbacks import ModelCheckpoint, Preemption

STEPS = 8


class SignalledModule(ClassifierModule):
    def __init__(self, signal_at_step: int | None = None, signal_number: int = signal.SIGUSR1) -> None:
        torch.manual_seed(0)
        super().__init__()
        self.signal_at_step = signal_at_step
        self.signal_number = signal_number

    def training_step(self, batch, batch_idx):
        if self.trainer.global_step == self.signal_at_step:
            os.kill(os.getpid(), self.signal_number)
        return super().training_step(batch, batch_idx)


def _fit(root, module, ckpt_path=None, signals=("SIGTERM", "SIGUSR1")):
    preemption = Preemption(signals=signals)
    checkpoints = ModelCheckpoint(dirpath=root / "checkpoints", every_n_train_steps=100)
    trainer = quiet_trainer(root, max_steps=STEPS, callbacks=[checkpoints, preemption], enable_checkpointing=True)
    trainer.fit(module, make_loader(), ckpt_path=ckpt_path)
    return trainer, preemption


@pytest.mark.parametrize("name", ["SIGUSR1", "SIGTERM"])
def test_a_signal_saves_at_the_next_step_and_the_resumed_fit_ends_as_an_uninterrupted_one(tmp_path, name):
    uninterrupted = SignalledModule()
    _fit(tmp_path / "uninterrupted", uninterrupted)
    trainer, preemption = _fit(tmp_path / "run", SignalledModule(signal_at_step=3, signal_number=signal.Signals[name]))
    assert preemption.received == name
    assert trainer.global_step == 4  # the step running when the signal came was finished, then saved
    assert preemption.saved_path == str(tmp_path / "run" / "checkpoints" / "preempted-step=4.ckpt")
    assert signal.getsignal(signal.Signals[name]) is not preemption._receive  # handler given back
    resumed = SignalledModule()
    trainer, _ = _fit(tmp_path / "run", resumed, ckpt_path="last")
    assert trainer.global_step == STEPS
    assert_bitwise_equal(parameters_of(resumed), parameters_of(uninterrupted))


@pytest.mark.parametrize("signals", [["SIGKILL"], ["SIGNOPE"], []])
def test_signals_that_cannot_be_caught_are_refused_naming_them(signals):
    with pytest.raises(ValueError, match=r"Preemption\(signals="):
        Preemption(signals=signals)
