import contextlib
from typing import Any

import pytest
import torch
from torch.nn import functional
from trainer_testing import ClassifierModule, make_loader, parameters_of, quiet_trainer

import stratagem
from stratagem.callbacks import Callback
from stratagem.strategies import (
    BackwardSyncControl,
    ChecksRunBeforeLaunch,
    OwnsAccumulation,
    SingleDeviceStrategy,
    TakesLoopSettings,
)


def test_fit_trains_the_module_and_counts_steps_and_epochs(tmp_path):
    torch.manual_seed(0)
    module = ClassifierModule()
    loader = make_loader(num_samples=64, batch_size=8)
    trainer = quiet_trainer(tmp_path, max_epochs=5)
    before = trainer.validate(module, loader)[0]["val_loss"]
    trainer.fit(module, loader)
    assert trainer.global_step == 40
    assert trainer.current_epoch == 5
    assert trainer.validate(module, loader)[0]["val_loss"] < before
    assert module.trainer is trainer


def test_max_steps_stops_in_the_middle_of_an_epoch(tmp_path):
    trainer = quiet_trainer(tmp_path, max_steps=11)
    trainer.fit(ClassifierModule(), make_loader(num_samples=64, batch_size=8))
    assert trainer.global_step == 11
    assert trainer.current_epoch == 1
    assert trainer.fit_progress.batches_in_epoch == 3


def test_limit_train_batches_as_count_and_as_fraction(tmp_path):
    trainer = quiet_trainer(tmp_path, max_epochs=2, limit_train_batches=3)
    trainer.fit(ClassifierModule(), make_loader(num_samples=64, batch_size=8))
    assert trainer.global_step == 6
    trainer = quiet_trainer(tmp_path, max_epochs=2, limit_train_batches=0.25)
    trainer.fit(ClassifierModule(), make_loader(num_samples=64, batch_size=8))
    assert trainer.global_step == 4


def test_limit_train_batches_zero_skips_training(tmp_path):
    module = ClassifierModule()
    before = parameters_of(module)
    trainer = quiet_trainer(tmp_path, max_epochs=2, limit_train_batches=0)
    trainer.fit(module, make_loader())
    assert (trainer.global_step, trainer.current_epoch) == (0, 0)
    assert all(torch.equal(before[name], value) for name, value in parameters_of(module).items())


def test_an_empty_training_source_stops_with_a_warning(tmp_path):
    with pytest.warns(UserWarning, match="produced no batch"):
        quiet_trainer(tmp_path, max_steps=5).fit(ClassifierModule(), iter([]))


def test_accumulating_two_half_batches_matches_one_full_batch(tmp_path):
    torch.manual_seed(0)
    accumulated, whole = ClassifierModule(), ClassifierModule()
    whole.load_state_dict(accumulated.state_dict())
    trainer = quiet_trainer(tmp_path, max_epochs=1, accumulate_grad_batches=2)
    trainer.fit(accumulated, make_loader(num_samples=32, batch_size=4))
    assert trainer.global_step == 4
    quiet_trainer(tmp_path, max_epochs=1).fit(whole, make_loader(num_samples=32, batch_size=8))
    for name, value in parameters_of(whole).items():
        torch.testing.assert_close(parameters_of(accumulated)[name], value, rtol=1e-5, atol=1e-6)


def test_an_unfinished_accumulation_window_is_stepped_at_the_end_of_the_epoch(tmp_path):
    trainer = quiet_trainer(tmp_path, max_epochs=2, accumulate_grad_batches=3)
    trainer.fit(ClassifierModule(), make_loader(num_samples=32, batch_size=8))
    assert trainer.global_step == 4


class _CallRecorder(SingleDeviceStrategy):
    """Single device, recording the calls the loop makes."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def backward(self, loss: torch.Tensor, optimizer: Any) -> None:
        self.calls.append("backward")
        super().backward(loss, optimizer)

    def clip_gradients(self, optimizer: Any, clip_val: float, algorithm: Any = "norm") -> Any:
        self.calls.append(f"clip {clip_val} {algorithm}")
        return super().clip_gradients(optimizer, clip_val, algorithm)

    def optimizer_step(self, optimizer: Any) -> Any:
        self.calls.append("step")
        return super().optimizer_step(optimizer)

    def zero_grad(self, optimizer: Any) -> None:
        self.calls.append("zero_grad")
        super().zero_grad(optimizer)


class _RecordingStrategy(_CallRecorder, BackwardSyncControl, TakesLoopSettings):
    def no_backward_sync(self, enabled: bool) -> Any:
        self.calls.append(f"no_sync={enabled}")
        return contextlib.nullcontext()


class _CountingStrategy(_CallRecorder, OwnsAccumulation):
    def set_accumulation_boundary(self, is_boundary: bool) -> None:
        self.calls.append(f"boundary={is_boundary}")


def test_accumulation_skips_gradient_sync_except_on_the_last_micro_batch_and_clips_before_stepping(tmp_path):
    strategy = _RecordingStrategy()
    trainer = quiet_trainer(
        tmp_path,
        strategy=strategy,
        max_steps=1,
        accumulate_grad_batches=2,
        gradient_clip_val=0.5,
        gradient_clip_algorithm="value",
    )
    trainer.fit(ClassifierModule(), make_loader())
    assert strategy.calls == [
        "no_sync=True",
        "backward",
        "no_sync=False",
        "backward",
        "clip 0.5 value",
        "step",
        "zero_grad",
    ]
    assert strategy.loop_settings.accumulate_grad_batches == 2
    assert strategy.loop_settings.gradient_clip_val == 0.5


def test_a_strategy_that_accumulates_itself_gets_backward_and_step_on_every_batch(tmp_path):
    strategy = _CountingStrategy()
    trainer = quiet_trainer(tmp_path, strategy=strategy, max_steps=1, accumulate_grad_batches=2)
    trainer.fit(ClassifierModule(), make_loader())
    assert strategy.calls == ["boundary=False", "backward", "step", "boundary=True", "backward", "step", "zero_grad"]
    assert trainer.global_step == 1


def test_a_strategy_that_accumulates_itself_is_told_the_window_ends_early_at_the_end_of_an_epoch(tmp_path):
    strategy = _CountingStrategy()
    trainer = quiet_trainer(tmp_path, strategy=strategy, max_epochs=2, accumulate_grad_batches=3)
    trainer.fit(ClassifierModule(), make_loader(num_samples=32, batch_size=8))
    boundaries = [call for call in strategy.calls if call.startswith("boundary")]
    # Four batches an epoch: a full window of three, then a window of one that the epoch cuts short.
    assert boundaries == 2 * ["boundary=False", "boundary=False", "boundary=True", "boundary=True"]
    assert trainer.global_step == 4


def test_gradient_clipping_by_norm_bounds_the_gradient_the_optimizer_sees(tmp_path):
    norms = []

    class Probe(ClassifierModule):
        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            original_step = optimizer.step

            def step(*args, **kwargs):
                grads = [p.grad for p in self.parameters() if p.grad is not None]
                norms.append(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item())
                return original_step(*args, **kwargs)

            optimizer.step = step
            return optimizer

    quiet_trainer(tmp_path, max_steps=4, gradient_clip_val=1e-3).fit(Probe(), make_loader())
    assert len(norms) == 4
    assert max(norms) <= 1e-3 * (1 + 1e-4)


def test_training_step_may_return_a_dict_with_the_loss_or_none_to_skip(tmp_path):
    class DictOrNone(ClassifierModule):
        def training_step(self, batch, batch_idx):
            if batch_idx % 2:
                return None
            return {"loss": super().training_step(batch, batch_idx), "extra": 1}

    trainer = quiet_trainer(tmp_path, max_epochs=1)
    trainer.fit(DictOrNone(), make_loader(num_samples=32, batch_size=8))
    assert trainer.global_step == 2


def test_training_step_returning_something_else_names_what_is_expected(tmp_path):
    class Wrong(ClassifierModule):
        def training_step(self, batch, batch_idx):
            return 3.0

    with pytest.raises(TypeError, match="training_step returned float"):
        quiet_trainer(tmp_path, max_steps=1).fit(Wrong(), make_loader())


def test_hooks_run_in_order_and_see_the_trainer(tmp_path):
    events = []

    class Hooked(ClassifierModule):
        def on_fit_start(self):
            events.append(("fit_start", self.trainer.global_step, self.global_rank, str(self.device)))

        def on_train_start(self):
            events.append("train_start")

        def on_train_epoch_start(self):
            events.append(f"epoch_start {self.trainer.current_epoch}")

        def on_train_batch_start(self, batch, batch_idx):
            events.append(f"batch_start {batch_idx}")

        def on_train_batch_end(self, outputs, batch, batch_idx):
            events.append(f"batch_end {batch_idx} step {self.trainer.global_step}")

        def on_validation_epoch_end(self):
            events.append("validation_epoch_end")

        def on_train_epoch_end(self):
            events.append(f"epoch_end {self.trainer.current_epoch}")

        def on_train_end(self):
            events.append("train_end")

        def on_fit_end(self):
            events.append("fit_end")

    trainer = quiet_trainer(tmp_path, max_epochs=1, num_sanity_val_steps=1)
    trainer.fit(Hooked(), make_loader(num_samples=16, batch_size=8), make_loader(num_samples=8, batch_size=8))
    assert events == [
        ("fit_start", 0, 0, "cpu"),
        "validation_epoch_end",
        "train_start",
        "epoch_start 0",
        "batch_start 0",
        "batch_end 0 step 1",
        "batch_start 1",
        "batch_end 1 step 2",
        "validation_epoch_end",
        "epoch_end 0",
        "train_end",
        "fit_end",
    ]


def test_validation_runs_at_the_requested_interval(tmp_path):
    def validation_steps(**options):
        seen = []

        class Recorder(Callback):
            def on_validation_end(self, trainer, module):
                if not trainer.sanity_checking:
                    seen.append(trainer.global_step)

        trainer = quiet_trainer(tmp_path, callbacks=[Recorder()], **options)
        trainer.fit(ClassifierModule(), make_loader(num_samples=64, batch_size=8), make_loader(num_samples=16))
        return seen

    assert validation_steps(max_epochs=2) == [8, 16]
    assert validation_steps(max_epochs=1, val_check_interval=0.25) == [2, 4, 6, 8]
    assert validation_steps(max_epochs=2, val_check_interval=3) == [3, 6, 11, 14]
    assert validation_steps(max_epochs=2, val_check_interval=3, check_val_every_n_epoch=None) == [3, 6, 9, 12, 15]
    assert validation_steps(max_epochs=4, check_val_every_n_epoch=2) == [16, 32]
    assert validation_steps(max_epochs=1, limit_val_batches=0) == []


def test_the_sanity_check_runs_before_training_and_leaves_no_metrics(tmp_path):
    seen = []

    class Recorder(Callback):
        def on_validation_end(self, trainer, module):
            seen.append((trainer.sanity_checking, dict(trainer.callback_metrics)))

    trainer = quiet_trainer(tmp_path, max_steps=1, num_sanity_val_steps=2, callbacks=[Recorder()])
    trainer.fit(ClassifierModule(), make_loader(), make_loader())
    assert seen[0][0] is True
    assert "val_loss" in seen[0][1]
    assert "val_loss" not in trainer.callback_metrics


def test_dataloaders_can_come_from_the_module(tmp_path):
    class WithData(ClassifierModule):
        def train_dataloader(self):
            return make_loader(num_samples=16, batch_size=8)

        def val_dataloader(self):
            return make_loader(num_samples=8, batch_size=8)

    trainer = quiet_trainer(tmp_path, max_epochs=1)
    trainer.fit(WithData())
    assert trainer.global_step == 2
    assert "val_loss" in trainer.callback_metrics


def test_several_optimizers_are_all_stepped_after_one_backward(tmp_path):
    class TwoOptimizers(ClassifierModule):
        def configure_optimizers(self):
            first, second = self.layers[0], self.layers[3]
            return [torch.optim.SGD(first.parameters(), lr=0.1), torch.optim.Adam(second.parameters(), lr=0.1)]

    module = TwoOptimizers()
    before = parameters_of(module)
    trainer = quiet_trainer(tmp_path, max_steps=2)
    trainer.fit(module, make_loader())
    after = parameters_of(module)
    assert all(not torch.equal(before[name], after[name]) for name in before)
    assert len(trainer.optimizers) == 2
    assert [type(optimizer) for optimizer in module.optimizers()] == [torch.optim.SGD, torch.optim.Adam]


def test_configure_model_builds_layers_on_the_device_in_the_precision_dtype(tmp_path):
    class Lazy(stratagem.Module):
        def __init__(self):
            super().__init__()
            self.layer = None

        def configure_model(self):
            if self.layer is None:
                self.layer = torch.nn.Linear(8, 2)

        def training_step(self, batch, batch_idx):
            return functional.cross_entropy(self.layer(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    module = Lazy()
    quiet_trainer(tmp_path, max_steps=2, precision="64-true").fit(module, make_loader())
    assert module.layer.weight.dtype == torch.float64


def test_init_module_creates_parameters_in_the_precision_dtype_and_empty_init_skips_initialisation(tmp_path):
    trainer = quiet_trainer(tmp_path, precision="bf16-true")
    with trainer.init_module():
        layer = torch.nn.Linear(4, 4)
    assert layer.weight.dtype == torch.bfloat16
    torch.manual_seed(0)
    with trainer.init_module(empty_init=True):
        skipped = torch.nn.Linear(512, 512)
    torch.manual_seed(0)
    initialised = torch.nn.Linear(512, 512).to(torch.bfloat16)
    assert not torch.equal(skipped.weight, initialised.weight)


def test_a_seed_makes_two_fits_identical(tmp_path):
    def run():
        trainer = quiet_trainer(tmp_path, max_epochs=2, seed=7)
        module = ClassifierModule(dropout=0.5)
        trainer.fit(module, make_loader(shuffle=True))
        return parameters_of(module)

    first, second = run(), run()
    assert all(torch.equal(first[name], second[name]) for name in first)


def test_deterministic_is_on_during_the_run_and_restored_after(tmp_path):
    seen = []

    class Probe(ClassifierModule):
        def on_train_start(self):
            seen.append(torch.are_deterministic_algorithms_enabled())

    quiet_trainer(tmp_path, max_steps=1, deterministic=True).fit(Probe(), make_loader())
    assert seen == [True]
    assert not torch.are_deterministic_algorithms_enabled()


def test_an_error_in_training_tears_the_strategy_down_and_reaches_callbacks(tmp_path):
    seen = []

    class Tracking(SingleDeviceStrategy):
        def teardown(self):
            seen.append("teardown")
            super().teardown()

    class Watcher(Callback):
        def on_exception(self, trainer, module, exception):
            seen.append(f"exception {exception}")

    class Failing(ClassifierModule):
        def training_step(self, batch, batch_idx):
            raise RuntimeError("boom")

    trainer = quiet_trainer(tmp_path, strategy=Tracking(), max_steps=1, callbacks=[Watcher()])
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(Failing(), make_loader())
    assert seen == ["exception boom", "teardown"]


def test_the_loop_drives_the_strategy_in_the_documented_order(tmp_path):
    order = []

    class Ordered(SingleDeviceStrategy):
        def setup_environment(self):
            order.append("setup_environment")
            super().setup_environment()

        def module_init_context(self, empty_init=None):
            order.append(f"module_init_context empty_init={empty_init}")
            return super().module_init_context(empty_init)

        def setup_module(self, module):
            order.append("setup_module")
            return super().setup_module(module)

        def setup_optimizers(self, optimizers):
            order.append("setup_optimizers")
            return super().setup_optimizers(optimizers)

        def run_step(self, step_name, *args):
            order.append(step_name)
            return super().run_step(step_name, *args)

        def teardown(self):
            order.append("teardown")
            super().teardown()

    class Module(ClassifierModule):
        def configure_model(self):
            order.append("configure_model")

        def configure_optimizers(self):
            order.append("configure_optimizers")
            return super().configure_optimizers()

    quiet_trainer(tmp_path, strategy=Ordered(), max_steps=1).fit(Module(), make_loader())
    assert order == [
        "setup_environment",
        "module_init_context empty_init=None",
        "configure_model",
        "setup_module",
        "configure_optimizers",
        "setup_optimizers",
        "training_step",
        "teardown",
    ]


class _InferenceOnlyStrategy(SingleDeviceStrategy, ChecksRunBeforeLaunch):
    def __init__(self) -> None:
        super().__init__()
        self.checked: list[str] = []

    def check_run(self, stage):
        self.checked.append(stage)
        if stage == "fit":
            raise ValueError("this strategy cannot train")


def test_a_run_the_strategy_refuses_in_check_run_fails_before_its_launcher_starts_anything(tmp_path, monkeypatch):
    strategy = _InferenceOnlyStrategy()
    trainer = quiet_trainer(tmp_path, strategy=strategy)
    launched = []
    real_launch = type(strategy.launcher).launch
    monkeypatch.setattr(
        type(strategy.launcher),
        "launch",
        lambda *arguments, **options: launched.append(1) or real_launch(*arguments, **options),
    )
    with pytest.raises(ValueError, match="this strategy cannot train"):
        trainer.fit(ClassifierModule(), make_loader(num_samples=16, batch_size=8))
    assert launched == []
    trainer.validate(ClassifierModule(), make_loader(num_samples=16, batch_size=8))
    assert strategy.checked == ["fit", "validate"]
    assert launched == [1]
