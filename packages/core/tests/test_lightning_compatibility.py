"""What a Lightning user's code does here: Lightning's spellings, hooks and collectives' arguments are
either honoured or refused naming stratagem's, never silently ignored."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist
from torch import nn

import stratagem
from stratagem import Module
from stratagem.strategies import SuppliesOptimizer
from stratagem.trainer.optimizers import configured_optimizers


class NoOptimizers(Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 2)


class ReturnsNone(NoOptimizers):
    def configure_optimizers(self) -> None:
        return None


class ReturnsEmpty(NoOptimizers):
    def configure_optimizers(self) -> tuple[list[torch.optim.Optimizer], list[object]]:
        return [], []


@pytest.mark.parametrize("module_class", [NoOptimizers, ReturnsNone, ReturnsEmpty])
def test_a_strategy_that_supplies_the_optimizer_accepts_every_way_of_returning_none(module_class):
    assert configured_optimizers(module_class(), strategy_supplies_optimizer=True).optimizers == []


@pytest.mark.parametrize(
    ("module_class", "error"),
    [(NoOptimizers, NotImplementedError), (ReturnsNone, TypeError), (ReturnsEmpty, ValueError)],
)
def test_other_strategies_still_need_an_optimizer_from_configure_optimizers(module_class, error):
    with pytest.raises(error, match="configure_optimizers"):
        configured_optimizers(module_class(), strategy_supplies_optimizer=False)


def test_no_built_in_core_strategy_supplies_its_own_optimizer():
    assert not isinstance(stratagem.resolve(strategy="single_device", accelerator="cpu", devices=1), SuppliesOptimizer)


@pytest.fixture
def single():
    return stratagem.resolve(strategy="single_device", accelerator="cpu", devices=1)


def test_reduce_returns_a_non_tensor_unchanged(single):
    value = {"not": "a tensor"}
    assert single.reduce(value) is value
    assert single.reduce(3.5, reduce_op="sum") == 3.5


@pytest.mark.parametrize("reduce_op", ["sum", "mean", "avg", dist.ReduceOp.SUM, dist.ReduceOp.MAX])
def test_lightnings_reduce_op_is_accepted_by_name_or_as_torchs_reduce_op(single, reduce_op):
    assert torch.equal(single.reduce(torch.ones(2), reduce_op=reduce_op), torch.ones(2))


def test_reduce_op_and_op_together_or_an_unknown_op_are_refused(single):
    with pytest.raises(TypeError, match="pass only op="):
        single.reduce(torch.ones(1), op="sum", reduce_op="max")
    with pytest.raises(ValueError, match=r"reduce\(op='median'\)"):
        single.reduce(torch.ones(1), reduce_op="median")


def test_group_is_accepted_by_reduce_and_all_gather(single):
    assert torch.equal(single.reduce(torch.ones(1), group=None), torch.ones(1))
    assert single.all_gather(torch.ones(3), group=None).shape == (1, 3)


class LitRegressor(Module):
    """Lightning's checkpointing page: hyperparameters saved in __init__, layers built in configure_model."""

    def __init__(self, hidden: int = 4, learning_rate: float = 0.1, **extra: object) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.seen_models: list[object] = []

    def configure_model(self) -> None:
        if not hasattr(self, "net"):
            self.net = nn.Sequential(nn.Linear(3, self.hparams.hidden), nn.ReLU(), nn.Linear(self.hparams.hidden, 1))

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.seen_models.append(self.trainer.model)
        return self.net(batch).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.learning_rate)


def _fit(module: Module, root, **options) -> stratagem.Trainer:
    trainer = stratagem.Trainer(
        strategy="single_device", accelerator="cpu", devices=1, max_steps=2, default_root_dir=root, logger=False,
        enable_progress_bar=False, **options,
    )  # fmt: skip
    trainer.fit(module, [torch.randn(2, 3) for _ in range(2)])
    return trainer


def test_load_from_checkpoint_rebuilds_the_module_from_its_saved_hyperparameters(tmp_path):
    module = LitRegressor(hidden=6, learning_rate=0.05, tag="run-1")
    assert module.hparams == {"hidden": 6, "learning_rate": 0.05, "tag": "run-1"}
    trainer = _fit(module, tmp_path)
    path = trainer.checkpoint_callback.best_model_path
    loaded = LitRegressor.load_from_checkpoint(path)
    assert loaded.hparams.hidden == 6
    assert loaded.hparams.tag == "run-1"
    assert not loaded.training
    for name, value in module.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name
    assert LitRegressor.load_from_checkpoint(path, learning_rate=0.5).hparams.learning_rate == 0.5


def test_save_hyperparameters_keeps_only_what_is_named_or_not_ignored():
    class Partial(Module):
        def __init__(self, a: int, b: int, c: int) -> None:
            super().__init__()
            self.save_hyperparameters("a", "b", ignore="b")

    assert Partial(1, 2, 3).hparams == {"a": 1}


def test_load_from_checkpoint_without_saved_hyperparameters_says_how_to_save_or_pass_them(tmp_path):
    class NeedsWidth(Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.layer = nn.Linear(3, width)

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            return self.layer(batch).sum()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    path = _fit(NeedsWidth(5), tmp_path).checkpoint_callback.best_model_path
    with pytest.raises(TypeError, match=r"call self.save_hyperparameters\(\) in __init__.*keyword arguments"):
        NeedsWidth.load_from_checkpoint(path)
    assert NeedsWidth.load_from_checkpoint(path, width=5).layer.out_features == 5


def test_trainer_model_is_the_strategys_wrapped_model_during_a_run(tmp_path):
    module = LitRegressor()
    trainer = stratagem.Trainer(strategy="single_device", accelerator="cpu", devices=1)
    assert trainer.model is None
    _fit(module, tmp_path, enable_checkpointing=False)
    assert module.seen_models
    assert all(seen is module for seen in module.seen_models)


class WithStepEnd(LitRegressor):
    def training_step_end(self, outputs: object) -> object:
        return outputs

    def validation_step_end(self, outputs: object) -> object:
        return outputs


def test_step_end_hooks_are_named_once_as_never_called(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _fit(WithStepEnd(), tmp_path, enable_checkpointing=False)
        _fit(WithStepEnd(), tmp_path, enable_checkpointing=False)
    messages = [str(warning.message) for warning in caught if "never calls" in str(warning.message)]
    assert len(messages) == 2
    assert "training_step_end(), which stratagem never calls" in messages[0]
    assert "end of training_step" in messages[0]
    assert "validation_step_end()" in messages[1]


def test_configure_sharded_model_is_refused_naming_configure_model(tmp_path):
    class OldSpelling(LitRegressor):
        def configure_sharded_model(self) -> None:
            self.configure_model()

    with pytest.raises(TypeError, match="Rename it to configure_model"):
        _fit(OldSpelling(), tmp_path)


def test_model_sharded_context_is_module_init_context(single):
    with single.model_sharded_context():
        layer = nn.Linear(2, 2)
    assert layer.weight.device == single.root_device
