"""LearningRateMonitor: each param group's learning rate reaches the loggers, named as Lightning names it."""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import pytest
import torch
from trainer_testing import ClassifierModule, make_loader, quiet_trainer

from stratagem.callbacks import LearningRateMonitor
from stratagem.trainer.optimizers import SchedulerConfig

pytest.importorskip("tensorboard", reason="TensorBoard is optional: pip install 'stratagem[tensorboard]'")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def _logged(trainer, tag):
    events = EventAccumulator(trainer.logger.log_dir)
    events.Reload()
    return [(event.step, pytest.approx(event.value)) for event in events.Scalars(tag)]


def test_tensorboard_shows_the_learning_rate_each_logged_step_uses(tmp_path):
    module = ClassifierModule(scheduler=partial(torch.optim.lr_scheduler.StepLR, step_size=2, gamma=0.5))
    trainer = quiet_trainer(
        tmp_path, max_steps=6, logger="tensorboard", log_every_n_steps=2, callbacks=[LearningRateMonitor()]
    )
    trainer.fit(_stepping_per_step(module), make_loader())
    assert _logged(trainer, "lr-SGD") == [(0, 0.1), (2, 0.05), (4, 0.025)]


def test_epoch_interval_logs_at_the_start_of_every_epoch(tmp_path):
    module = ClassifierModule(scheduler=partial(torch.optim.lr_scheduler.StepLR, step_size=1, gamma=0.1))
    trainer = quiet_trainer(
        tmp_path, max_epochs=2, logger="tensorboard", callbacks=[LearningRateMonitor(logging_interval="epoch")]
    )
    trainer.fit(module, make_loader())
    assert _logged(trainer, "lr-SGD") == [(0, 0.1), (8, 0.01)]


def test_names_follow_lightning_for_param_groups_repeated_classes_and_named_schedulers():
    weights = [torch.nn.Parameter(torch.zeros(1)) for _ in range(5)]
    adam = torch.optim.Adam([{"params": [weights[0]]}, {"params": [weights[1]], "lr": 0.5}], lr=0.1)
    named_groups = torch.optim.SGD([{"params": [weights[2]], "name": "head"}, {"params": [weights[3]]}], lr=0.2)
    second_sgd = torch.optim.SGD([weights[4]], lr=0.3)
    scheduler = torch.optim.lr_scheduler.StepLR(second_sgd, step_size=1)
    trainer = SimpleNamespace(
        optimizers=[adam, named_groups, second_sgd],
        lr_scheduler_configs=[SchedulerConfig(scheduler, name="decoder-lr")],
    )
    assert LearningRateMonitor().learning_rates(trainer) == {
        "lr-Adam/pg1": 0.1,
        "lr-Adam/pg2": 0.5,
        "lr-SGD/head": 0.2,
        "lr-SGD/pg2": 0.2,
        "decoder-lr": 0.3,
    }


def test_a_bad_interval_and_a_trainer_without_logger_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"logging_interval='batch'\) is not valid; expected 'step' or 'epoch'"):
        LearningRateMonitor(logging_interval="batch")
    trainer = quiet_trainer(tmp_path, max_steps=1, callbacks=[LearningRateMonitor()])
    with pytest.raises(ValueError, match="LearningRateMonitor has nothing to log to"):
        trainer.fit(ClassifierModule(), make_loader())


def _stepping_per_step(module: ClassifierModule) -> ClassifierModule:
    make_scheduler = module.scheduler

    def configure_optimizers():
        optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": make_scheduler(optimizer), "interval": "step"}}

    module.configure_optimizers = configure_optimizers
    return module
