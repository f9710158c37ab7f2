"""Optional strategy abilities: chosen once per fit as an accumulation policy, never branched on per batch."""

import ast
import contextlib
import inspect
from pathlib import Path
from typing import Any

import pytest
import torch
from trainer_testing import ClassifierModule, make_loader, quiet_trainer

import stratagem.trainer.accumulation as accumulation_module
import stratagem.trainer.evaluation_loop as evaluation_loop_module
import stratagem.trainer.fit_loop as fit_loop_module
import stratagem.trainer.predict_loop as predict_loop_module
from stratagem.runtime import Runtime
from stratagem.strategies import (
    BackwardSyncControl,
    ChecksRunBeforeLaunch,
    FeedsBatchesToDevice,
    LoopSettings,
    OwnsAccumulation,
    SingleDeviceStrategy,
    Strategy,
)
from stratagem.trainer.accumulation import (
    AccumulationPolicy,
    EngineAccumulation,
    TrainerAccumulation,
    accumulation_policy,
)

CAPABILITY_NAMES = {
    "BackwardSyncControl",
    "OwnsAccumulation",
    "OwnsTrainingStep",
    "RebuildsDataLoaders",
    "rebuild_dataloader",
    "handles_gradient_accumulation",
    "no_backward_sync",
    "set_accumulation_boundary",
}


def _policy(strategy: Strategy, accumulate: int, optimizers: list[Any]) -> AccumulationPolicy:
    """The policy a fit of ``strategy`` gets, stepping optimizers as the fit loop's calls do."""
    return accumulation_policy(Runtime.around(strategy), accumulate, optimizers, strategy.optimizer_step)


def _names_in(tree: ast.AST) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.add(node.value)
    return found


def test_the_fit_loop_never_refers_to_a_capability():
    tree = ast.parse(Path(inspect.getfile(fit_loop_module)).read_text())
    assert _names_in(tree) & CAPABILITY_NAMES == set()
    isinstance_arguments = {
        name
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"
        for name in _names_in(node.args[1])
    }
    assert not isinstance_arguments & {"Strategy", "BackwardSyncControl", "OwnsAccumulation", "OwnsTrainingStep"}


def test_abilities_are_looked_at_only_where_the_accumulation_policy_is_chosen():
    tree = ast.parse(Path(inspect.getfile(accumulation_module)).read_text())
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef) or function.name == "accumulation_policy":
            continue
        assert (
            _names_in(function)
            & {"BackwardSyncControl", "OwnsAccumulation", "OwnsTrainingStep", "handles_gradient_accumulation"}
            == set()
        )


def test_the_strategy_base_class_has_no_do_nothing_capability_defaults():
    for name in ("no_backward_sync", "set_accumulation_boundary", "handles_gradient_accumulation"):
        assert not hasattr(Strategy, name), name
    assert not hasattr(Strategy, "checkpoint_is_directory")


class _SyncControlled(SingleDeviceStrategy, BackwardSyncControl):
    def __init__(self) -> None:
        super().__init__()
        self.skipped: list[bool] = []

    def no_backward_sync(self, enabled: bool) -> Any:
        self.skipped.append(enabled)
        return contextlib.nullcontext()


class _Engine(SingleDeviceStrategy, OwnsAccumulation):
    def __init__(self) -> None:
        super().__init__()
        self.boundaries: list[bool] = []
        self.steps = 0

    def set_accumulation_boundary(self, is_boundary: bool) -> None:
        self.boundaries.append(is_boundary)

    def optimizer_step(self, optimizer: Any) -> Any:
        self.steps += 1
        return super().optimizer_step(optimizer)


def test_a_strategy_that_controls_backward_sync_gets_trainer_accumulation_with_its_sync_control():
    strategy = _SyncControlled()
    policy = _policy(strategy, 4, [])
    assert isinstance(policy, TrainerAccumulation)
    with policy.micro_batch(is_boundary=False):
        pass
    with policy.micro_batch(is_boundary=True):
        pass
    assert strategy.skipped == [True, False]
    torch.testing.assert_close(policy.scale_loss(torch.tensor(2.0)), torch.tensor(0.5))


def test_without_accumulation_backward_sync_is_never_skipped_and_the_loss_is_unchanged():
    strategy = _SyncControlled()
    policy = _policy(strategy, 1, [])
    with policy.micro_batch(is_boundary=True):
        pass
    assert strategy.skipped == []
    loss = torch.tensor(3.0)
    assert policy.scale_loss(loss) is loss


def test_without_accumulation_every_batch_steps_with_its_loss_unscaled_and_no_sync_context(tmp_path):
    strategy = _SyncControlled()
    scaled: list[torch.Tensor] = []
    backward = strategy.backward
    strategy.backward = lambda loss, optimizer: (scaled.append(loss), backward(loss, optimizer))  # type: ignore[method-assign]
    trainer = quiet_trainer(tmp_path, strategy=strategy, max_epochs=1, accumulate_grad_batches=1)
    module = ClassifierModule()
    returned: list[torch.Tensor] = []
    training_step = module.training_step
    module.training_step = lambda batch, batch_idx: returned.append(training_step(batch, batch_idx)) or returned[-1]  # type: ignore[method-assign]
    trainer.fit(module, make_loader(num_samples=40, batch_size=8))
    assert isinstance(_policy(strategy, 1, []), accumulation_module.StepEveryBatch)
    assert strategy.skipped == []
    assert trainer.global_step == 5
    assert len(scaled) == 5
    assert all(loss is step_loss for loss, step_loss in zip(scaled, returned))
    assert trainer.progress_bar_metrics["loss"] == pytest.approx(returned[-1].item())


def test_a_plain_strategy_accumulates_in_the_trainer_and_syncs_every_micro_batch():
    policy = _policy(SingleDeviceStrategy(), 2, [])
    assert isinstance(policy, TrainerAccumulation)
    with policy.micro_batch(is_boundary=False):
        pass
    torch.testing.assert_close(policy.scale_loss(torch.tensor(2.0)), torch.tensor(1.0))


def test_an_engine_is_told_every_boundary_and_stepped_between_boundaries_with_the_loss_unscaled():
    strategy = _Engine()
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    policy = _policy(strategy, 2, [optimizer])
    assert isinstance(policy, EngineAccumulation)
    with policy.micro_batch(is_boundary=False):
        pass
    policy.between_steps()
    loss = torch.tensor(2.0)
    assert policy.scale_loss(loss) is loss
    assert strategy.boundaries == [False]
    assert strategy.steps == 1


def test_an_engine_is_told_every_boundary_of_a_fit_including_windows_cut_short_by_the_epoch(tmp_path):
    strategy = _Engine()
    trainer = quiet_trainer(tmp_path, strategy=strategy, max_epochs=2, accumulate_grad_batches=3)
    trainer.fit(ClassifierModule(), make_loader(num_samples=40, batch_size=8))
    # Five batches an epoch: a window of three, then one of two that the epoch cuts short.
    assert strategy.boundaries == 2 * [False, False, True, False, True]
    assert strategy.steps == 10
    assert trainer.global_step == 4


# -- plugins written against 0.1 ----------------------------------------------------------------


def test_a_0_1_plugin_with_the_accumulation_flag_is_treated_as_an_engine_that_owns_accumulation(tmp_path):
    with pytest.warns(DeprecationWarning, match="handles_gradient_accumulation.*OwnsAccumulation"):

        class LegacyEngine(SingleDeviceStrategy):
            handles_gradient_accumulation = True

            def __init__(self) -> None:
                super().__init__()
                self.boundaries: list[bool] = []

            def set_accumulation_boundary(self, is_boundary: bool) -> None:
                self.boundaries.append(is_boundary)

    strategy = LegacyEngine()
    assert isinstance(strategy, OwnsAccumulation)
    trainer = quiet_trainer(tmp_path, strategy=strategy, max_steps=2, accumulate_grad_batches=2)
    trainer.fit(ClassifierModule(), make_loader())
    assert strategy.boundaries == [False, True, False, True]
    assert trainer.global_step == 2


def test_a_0_1_plugin_overriding_no_backward_sync_keeps_skipping_sync_while_accumulating(tmp_path):
    with pytest.warns(DeprecationWarning, match="no_backward_sync.*BackwardSyncControl"):

        class LegacySync(SingleDeviceStrategy):
            def __init__(self) -> None:
                super().__init__()
                self.skipped: list[bool] = []

            def no_backward_sync(self, enabled: bool) -> Any:
                self.skipped.append(enabled)
                return contextlib.nullcontext()

    strategy = LegacySync()
    assert isinstance(strategy, BackwardSyncControl)
    quiet_trainer(tmp_path, strategy=strategy, max_steps=1, accumulate_grad_batches=2).fit(
        ClassifierModule(), make_loader()
    )
    assert strategy.skipped == [True, False]


def test_a_0_1_plugin_with_the_accumulation_flag_but_no_boundary_method_is_refused_naming_the_fix():
    with pytest.raises(
        TypeError, match=r"handles_gradient_accumulation.*subclass stratagem\.strategies\.OwnsAccumulation"
    ):

        class Incomplete(SingleDeviceStrategy):
            handles_gradient_accumulation = True


def test_a_strategy_opting_in_explicitly_gets_no_deprecation_warning(recwarn):
    class Explicit(SingleDeviceStrategy, OwnsAccumulation):
        handles_gradient_accumulation = True

        def set_accumulation_boundary(self, is_boundary: bool) -> None:
            pass

    assert not [warning for warning in recwarn if issubclass(warning.category, DeprecationWarning)]


class _FeedsBatches(SingleDeviceStrategy, FeedsBatchesToDevice):
    def __init__(self) -> None:
        super().__init__()
        self.passes: list[int] = []

    def device_batches(self, batches: Any) -> Any:
        self.passes.append(0)
        for batch in batches:
            self.passes[-1] += 1
            yield batch


def test_every_pass_reads_its_batches_through_a_strategy_that_feeds_them_to_the_device(tmp_path):
    strategy = _FeedsBatches()
    trainer = quiet_trainer(tmp_path, strategy=strategy, max_epochs=2, num_sanity_val_steps=0)
    module = ClassifierModule()
    train, val = make_loader(), make_loader()
    trainer.fit(module, train, val)
    trainer.validate(module, val)
    trainer.predict(module, val)
    batches = len(train)
    # Two epochs, each followed by validation; then validate and predict: one pass each, every batch read.
    assert strategy.passes == [batches, len(val), batches, len(val), len(val), len(val)]


def test_the_batch_feed_ability_is_looked_at_only_where_the_feed_is_chosen():
    import stratagem.runtime.runtime as runtime_module
    import stratagem.trainer.data as data_module

    tree = ast.parse(Path(inspect.getfile(runtime_module)).read_text())
    for function in ast.walk(tree):
        if isinstance(function, ast.FunctionDef) and function.name != "batch_feed":
            assert "FeedsBatchesToDevice" not in _names_in(function), function.name
    for module in (fit_loop_module, evaluation_loop_module, predict_loop_module, data_module):
        assert "FeedsBatchesToDevice" not in _names_in(ast.parse(Path(inspect.getfile(module)).read_text()))


# -- Trainer-only members that left Strategy ------------------------------------------------------


def test_strategy_keeps_none_of_the_trainer_only_members():
    for name in (
        "loop_settings",
        "connect_loop_settings",
        "check_run",
        "check_lr_schedulers",
        "max_lr_schedulers",
        "steps_lr_schedulers",
        "supplies_optimizer",
        "manual_optimization_unsupported",
        "checks_steps_on_host",
    ):
        assert not hasattr(Strategy, name), name


def test_a_plugin_still_declaring_check_run_on_strategy_is_treated_as_checking_runs(tmp_path):
    with pytest.warns(DeprecationWarning, match="check_run.*ChecksRunBeforeLaunch"):

        class LegacyInferenceOnly(SingleDeviceStrategy):
            def check_run(self, stage: str) -> None:
                if stage == "fit":
                    raise ValueError("legacy: cannot train")

    strategy = LegacyInferenceOnly()
    assert isinstance(strategy, ChecksRunBeforeLaunch)
    with pytest.raises(ValueError, match="legacy: cannot train"):
        quiet_trainer(tmp_path, strategy=strategy).fit(ClassifierModule(), make_loader())


def test_a_plugin_still_declaring_checks_steps_on_host_false_gets_no_per_step_loss_reads():
    with pytest.warns(DeprecationWarning, match="checks_steps_on_host = False.*DefersHostReads"):

        class LegacyLazy(SingleDeviceStrategy):
            checks_steps_on_host = False

    assert not Runtime.around(LegacyLazy()).reads_steps_on_host
    assert Runtime.around(SingleDeviceStrategy()).reads_steps_on_host


def test_a_plugin_overriding_a_member_that_moved_to_a_mixin_is_refused_naming_the_mixin():
    with pytest.raises(TypeError, match=r"connect_loop_settings.*stratagem\.strategies\.TakesLoopSettings"):

        class LegacySettings(SingleDeviceStrategy):
            def connect_loop_settings(self, settings: LoopSettings) -> None:
                pass

    with pytest.raises(TypeError, match=r"steps_lr_schedulers.*stratagem\.strategies\.StepsLRSchedulers"):

        class LegacySchedulers(SingleDeviceStrategy):
            steps_lr_schedulers = True


def test_a_strategy_declaring_no_trainer_only_ability_is_told_no_loop_settings_and_runs_with_defaults(tmp_path):
    class Plain(SingleDeviceStrategy):
        pass

    strategy = Plain()
    trainer = quiet_trainer(tmp_path, strategy=strategy, max_steps=2, accumulate_grad_batches=2, gradient_clip_val=1.0)
    trainer.fit(ClassifierModule(), make_loader())
    assert trainer.global_step == 2
    assert not hasattr(strategy, "loop_settings")
    assert trainer.runtime.loop_settings.accumulate_grad_batches == 2
