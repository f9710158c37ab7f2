"""Ranks seeded differently still start from rank 0's weights, whether the other ranks built the module on the meta
device (rank 0 building it eagerly) or every rank built it eagerly."""

import pytest
import torch
import torch.distributed as dist
from fsdp_testing import Block, Net, make_strategy
from torch import nn

from stratagem.testing import DistributedWorkers

pytestmark = pytest.mark.distributed

RANK_ZERO_SEED = 100


@pytest.fixture(scope="module")
def workers():
    with DistributedWorkers(2, env={"OMP_NUM_THREADS": "1"}) as pool:
        yield pool


def _model() -> nn.Module:
    """Uneven shards (Net) and a module that resets its own parameters after its children's (attention)."""
    return nn.ModuleList([Net(), nn.TransformerEncoderLayer(4, 2, dim_feedforward=6, dropout=0.0)])


def _set_up_with_a_seed_per_rank(empty_init, options):
    strategy = make_strategy(**options)
    torch.manual_seed(RANK_ZERO_SEED + dist.get_rank())
    with strategy.module_init_context(empty_init=empty_init):
        module = _model()
    on_meta = all(parameter.is_meta for parameter in module.parameters())
    strategy.setup_module(module)
    # full_tensor() on every rank: what all ranks' shards (or replicas) hold together, seen from each rank.
    whole = {name: parameter.full_tensor().detach().clone() for name, parameter in module.named_parameters()}
    return {"on_meta": on_meta, "whole": whole, "next_draw": torch.rand(4)}


def _plain_init_of_rank_zero():
    torch.manual_seed(RANK_ZERO_SEED)
    module = _model()
    return dict(module.named_parameters()), torch.rand(4)


@pytest.mark.parametrize(
    "options",
    [{"auto_wrap_policy": {Block}}, {"sharding_strategy": "NO_SHARD"}, {"cpu_offload": True}],
    ids=["full_shard", "no_shard", "cpu_offload"],
)
@pytest.mark.parametrize(
    ("empty_init", "on_meta_per_rank"), [(None, [False, True]), (False, [False, False])], ids=["meta", "normal"]
)
def test_every_rank_holds_rank_zeros_plain_init_when_ranks_are_seeded_differently(
    workers, options, empty_init, on_meta_per_rank
):
    results = workers.run(_set_up_with_a_seed_per_rank, empty_init, options)
    expected, _ = _plain_init_of_rank_zero()
    assert [result["on_meta"] for result in results] == on_meta_per_rank
    for rank, result in enumerate(results):
        assert result["whole"].keys() == expected.keys()
        for name, value in expected.items():
            assert torch.equal(result["whole"][name], value), f"rank {rank}: {name}"


def test_meta_init_leaves_rank_zero_where_its_plain_init_would_and_other_ranks_their_own_stream(workers):
    rank_zero, rank_one = workers.run(_set_up_with_a_seed_per_rank, None, {})
    _, next_after_plain_init = _plain_init_of_rank_zero()
    assert torch.equal(rank_zero["next_draw"], next_after_plain_init)
    torch.manual_seed(RANK_ZERO_SEED + 1)
    assert torch.equal(rank_one["next_draw"], torch.rand(4))
