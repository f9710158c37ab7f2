"""Manual optimization as in Lightning (``automatic_optimization = False``) on one process, the hooks around
backward and the optimizer step in Lightning's order, and the settings and strategies that cannot run it
refused before the run."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from trainer_testing import ClassifierModule, make_loader, quiet_trainer

import stratagem
from stratagem.callbacks import Callback
from stratagem.strategies import OwnsAccumulation, SingleDeviceStrategy
from stratagem.trainer.manual_optimization import ManualOptimizer


class TwoOptimizers(stratagem.Module):
    """Two halves of one classifier, each with its own optimizer and scheduler, stepped in training_step."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.features = nn.Linear(8, 8)
        self.head = nn.Linear(8, 2)
        self.events: list[str] = []

    def training_step(self, batch, batch_idx):
        features_optimizer, head_optimizer = self.optimizers()
        inputs, targets = batch
        self.events.append("training_step")
        for optimizer in (features_optimizer, head_optimizer):
            with self.toggled_optimizer(optimizer):
                loss = nn.functional.cross_entropy(self.head(torch.tanh(self.features(inputs))), targets)
                self.manual_backward(loss)
                self.clip_gradients(optimizer, gradient_clip_val=1.0)
                optimizer.step()
                optimizer.zero_grad()
        for scheduler in self.lr_schedulers():
            scheduler.step()
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        features = torch.optim.SGD(self.features.parameters(), lr=0.1)
        head = torch.optim.Adam(self.head.parameters(), lr=0.01)
        schedulers = [torch.optim.lr_scheduler.StepLR(each, step_size=1, gamma=0.9) for each in (features, head)]
        return [features, head], schedulers

    def on_train_batch_start(self, batch, batch_idx):
        self.events.append("module.on_train_batch_start")

    def on_before_backward(self, loss):
        self.events.append("module.on_before_backward")

    def on_after_backward(self):
        self.events.append("module.on_after_backward")

    def on_before_optimizer_step(self, optimizer):
        self.events.append("module.on_before_optimizer_step")

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.events.append("module.on_train_batch_end")


class RecordHooks(Callback):
    def __init__(self, events: list[str]) -> None:
        self.events = events

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.events.append("callback.on_train_batch_start")

    def on_before_backward(self, trainer, module, loss):
        self.events.append("callback.on_before_backward")

    def on_after_backward(self, trainer, module):
        self.events.append("callback.on_after_backward")

    def on_before_optimizer_step(self, trainer, module, optimizer):
        self.events.append("callback.on_before_optimizer_step")

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.events.append("callback.on_train_batch_end")


BACKWARD_AND_STEP = [
    "callback.on_before_backward",
    "module.on_before_backward",
    "callback.on_after_backward",
    "module.on_after_backward",
    "callback.on_before_optimizer_step",
    "module.on_before_optimizer_step",
]
BATCH_START = ["callback.on_train_batch_start", "module.on_train_batch_start"]
BATCH_END = ["callback.on_train_batch_end", "module.on_train_batch_end"]


def test_manual_hooks_fire_in_lightnings_order_around_each_backward_and_step(tmp_path):
    module = TwoOptimizers()
    trainer = quiet_trainer(tmp_path, max_steps=2, callbacks=[RecordHooks(module.events)])
    trainer.fit(module, make_loader())
    assert module.events == [*BATCH_START, "training_step", *BACKWARD_AND_STEP, *BACKWARD_AND_STEP, *BATCH_END]


class AutomaticWithHooks(ClassifierModule):
    def __init__(self) -> None:
        super().__init__()
        self.events: list[str] = []

    def training_step(self, batch, batch_idx):
        self.events.append("training_step")
        return super().training_step(batch, batch_idx)

    on_train_batch_start = TwoOptimizers.on_train_batch_start
    on_before_backward = TwoOptimizers.on_before_backward
    on_after_backward = TwoOptimizers.on_after_backward
    on_before_optimizer_step = TwoOptimizers.on_before_optimizer_step
    on_train_batch_end = TwoOptimizers.on_train_batch_end


def test_automatic_hooks_fire_in_lightnings_order_and_the_step_hook_only_on_the_accumulation_boundary(tmp_path):
    module = AutomaticWithHooks()
    trainer = quiet_trainer(tmp_path, max_steps=1, accumulate_grad_batches=2, callbacks=[RecordHooks(module.events)])
    trainer.fit(module, make_loader())
    backward = BACKWARD_AND_STEP[:4]
    step = BACKWARD_AND_STEP[4:]
    first = [*BATCH_START, "training_step", *backward, *BATCH_END]
    assert module.events == [*first, *BATCH_START, "training_step", *backward, *step, *BATCH_END]


def test_on_before_backward_sees_the_loss_divided_for_accumulation(tmp_path):
    returned, seen = [], []

    class Record(Callback):
        def on_before_backward(self, trainer, module, loss):
            seen.append(loss.item())

    class KeepsLoss(ClassifierModule):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            returned.append(loss.item())
            return loss

    quiet_trainer(tmp_path, max_steps=1, accumulate_grad_batches=2, callbacks=[Record()]).fit(
        KeepsLoss(), make_loader()
    )
    assert seen == pytest.approx([loss / 2 for loss in returned])
    assert len(seen) == 2


def test_every_manual_optimizer_step_counts_and_schedulers_step_only_when_training_step_steps_them(tmp_path):
    module = TwoOptimizers()
    trainer = quiet_trainer(tmp_path, max_steps=6)
    trainer.fit(module, make_loader())
    # Two optimizers stepped per batch, as in Lightning: six steps are three batches.
    assert trainer.global_step == 6
    assert trainer.fit_progress.total_batches == 3
    features, head = trainer.lr_scheduler_configs
    assert features.scheduler.last_epoch == head.scheduler.last_epoch == 3
    assert trainer.optimizers[1].state[module.head.weight]["step"].item() == 3


def test_optimizers_and_schedulers_come_as_lightning_hands_them_out(tmp_path):
    shapes = {}

    class Inspect(TwoOptimizers):
        def training_step(self, batch, batch_idx):
            shapes["wrapped"] = [type(each) for each in self.optimizers()]
            shapes["plain"] = [type(each) for each in self.optimizers(use_pl_optimizer=False)]
            shapes["param_groups"] = self.optimizers()[0].param_groups is self.trainer.optimizers[0].param_groups
            return super().training_step(batch, batch_idx)

    class OneOptimizer(ClassifierModule):
        def training_step(self, batch, batch_idx):
            shapes["one"] = (self.optimizers(), self.lr_schedulers())
            return super().training_step(batch, batch_idx)

    quiet_trainer(tmp_path, max_steps=2).fit(Inspect(), make_loader())
    assert shapes["wrapped"] == [ManualOptimizer, ManualOptimizer]
    assert shapes["plain"] == [torch.optim.SGD, torch.optim.Adam]
    assert shapes["param_groups"]
    trainer = quiet_trainer(tmp_path, max_steps=1)
    trainer.fit(OneOptimizer(), make_loader())
    assert shapes["one"] == (trainer.optimizers[0], None)


def test_toggle_freezes_the_other_optimizers_parameters_and_untoggle_restores_them(tmp_path):
    flags = {}

    class Toggles(TwoOptimizers):
        def training_step(self, batch, batch_idx):
            features_optimizer, _ = self.optimizers()
            self.head.bias.requires_grad_(False)  # frozen by the user: stays frozen after untoggle
            self.toggle_optimizer(features_optimizer)
            flags["toggled"] = [p.requires_grad for p in self.parameters()]
            self.untoggle_optimizer(features_optimizer)
            flags["untoggled"] = [p.requires_grad for p in self.parameters()]
            self.head.bias.requires_grad_(True)
            return super().training_step(batch, batch_idx)

    quiet_trainer(tmp_path, max_steps=2).fit(Toggles(), make_loader())
    assert flags == {"toggled": [True, True, False, False], "untoggled": [True, True, True, False]}


def test_manual_backward_under_automatic_optimization_says_how_to_switch(tmp_path):
    class Confused(ClassifierModule):
        def training_step(self, batch, batch_idx):
            self.manual_backward(super().training_step(batch, batch_idx))

    with pytest.raises(RuntimeError, match=r"set self.automatic_optimization = False in __init__"):
        quiet_trainer(tmp_path, max_steps=1).fit(Confused(), make_loader())


def test_a_manual_step_that_never_steps_an_optimizer_is_named(tmp_path):
    class NeverSteps(TwoOptimizers):
        def training_step(self, batch, batch_idx):
            self.manual_backward(self.head(self.features(batch[0])).sum())

    with pytest.raises(RuntimeError, match=r"called step\(\) on none of the optimizers"):
        quiet_trainer(tmp_path, max_epochs=1).fit(NeverSteps(), make_loader())


def test_a_non_finite_loss_given_to_manual_backward_stops_the_run_naming_the_batch(tmp_path):
    class Diverges(TwoOptimizers):
        def training_step(self, batch, batch_idx):
            self.manual_backward(self.head(self.features(batch[0])).sum() * float("nan"))

    with pytest.raises(RuntimeError, match=r"manual_backward got a non-finite loss .* at batch_idx 0 of epoch 0"):
        quiet_trainer(tmp_path, max_steps=2).fit(Diverges(), make_loader())


class EngineOwnsTheStep(SingleDeviceStrategy, OwnsAccumulation):
    def set_accumulation_boundary(self, is_boundary: bool) -> None:
        pass


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"accumulate_grad_batches": 2}, r"accumulate_grad_batches=2: the Trainer accumulates only"),
        ({"gradient_clip_val": 0.5}, r"gradient_clip_val=0.5.*self.clip_gradients\(optimizer"),
        ({"nonfinite": "skip"}, r"nonfinite='skip'"),
    ],
)
def test_settings_manual_optimization_cannot_honour_are_refused_before_the_run(tmp_path, options, message):
    module = TwoOptimizers()
    with pytest.raises(ValueError, match=message):
        quiet_trainer(tmp_path, max_steps=1, **options).fit(module, make_loader())
    assert module.events == []


def test_a_strategy_whose_engine_owns_the_step_refuses_manual_optimization_by_its_ability(tmp_path):
    strategy = EngineOwnsTheStep(accelerator=stratagem.registry.accelerators.create("cpu"))
    module = TwoOptimizers()
    with pytest.raises(ValueError, match=r"EngineOwnsTheStep cannot run: its engine runs backward and the optimizer"):
        quiet_trainer(tmp_path, strategy=strategy, max_steps=1).fit(module, make_loader())
    assert module.events == []


def test_automatic_optimization_must_be_a_bool(tmp_path):
    module = TwoOptimizers()
    module.automatic_optimization = "no"
    with pytest.raises(TypeError, match=r"automatic_optimization='no' is not valid; expected True or False"):
        quiet_trainer(tmp_path, max_steps=1).fit(module, make_loader())
