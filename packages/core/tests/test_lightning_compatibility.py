"""What a Lightning user's code does here: Lightning's spellings, hooks and collectives' arguments are
either honoured or refused naming stratagem's, never silently ignored."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

import stratagem
from stratagem import Module
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
    assert not stratagem.resolve(strategy="single_device", accelerator="cpu", devices=1).supplies_optimizer


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


def _collectives_with_a_group() -> tuple[float, float, list[float], str]:
    strategy = stratagem.resolve(strategy="ddp", accelerator="cpu", devices=2)
    strategy.setup_environment()
    group = dist.new_group([0, 1])
    rank = torch.tensor([float(dist.get_rank() + 1)])
    summed = strategy.reduce(rank, reduce_op="sum", group=group).item()
    mean = strategy.reduce(rank, group=group).item()
    gathered = strategy.all_gather(rank, group=group).flatten().tolist()
    return summed, mean, gathered, strategy.reduce("unchanged", reduce_op="sum")


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_reduce_and_all_gather_take_lightnings_group_and_reduce_op_on_two_processes():
    from stratagem.testing import DistributedWorkers

    with DistributedWorkers(2, env={"OMP_NUM_THREADS": "1"}) as workers:
        results = workers.run(_collectives_with_a_group)
    assert results == [(3.0, 1.5, [1.0, 2.0], "unchanged")] * 2
