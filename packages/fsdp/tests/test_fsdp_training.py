"""Training with FSDPStrategy on 2 real gloo ranks, compared with one plain process on the same global batches."""

import warnings

import pytest
import torch
import torch.distributed as dist
from fsdp_testing import (
    Block,
    Net,
    build,
    global_batches,
    local_and_total_numel,
    local_part,
    make_strategy,
    reference_run,
    train,
)
from torch import nn
from torch.distributed._composable import checkpoint
from torch.distributed._composable.contract import _get_registry
from torch.distributed.fsdp import FSDPModule, fully_shard

from stratagem.testing import DistributedWorkers

pytestmark = pytest.mark.distributed

STEPS = 4


@pytest.fixture(scope="module")
def workers():
    with DistributedWorkers(2, env={"OMP_NUM_THREADS": "1"}) as pool:
        yield pool


def _train_and_report(options, clip=None):
    strategy = make_strategy(**options)
    module, optimizer = build(strategy)
    local, total = local_and_total_numel(module)
    losses = train(strategy, optimizer, global_batches(STEPS), clip=clip)
    return {"losses": losses, "local": local, "total": total, "weights": strategy.module_full_state_dict()}


def _assert_matches_reference(results, clip=None):
    reference_losses, reference_weights = reference_run(global_batches(STEPS), clip=clip)
    for rank_result in results:
        assert rank_result["losses"] == pytest.approx(reference_losses, rel=1e-5, abs=1e-6)
    weights = results[0]["weights"]
    assert weights.keys() == reference_weights.keys()
    for key, value in reference_weights.items():
        torch.testing.assert_close(weights[key], value, rtol=1e-4, atol=1e-5)
    assert results[1]["weights"] == {}


def test_full_shard_trains_like_one_process_and_each_rank_holds_about_half(workers):
    results = workers.run(_train_and_report, {"auto_wrap_policy": {Block}})
    _assert_matches_reference(results)
    total = results[0]["total"]
    assert results[0]["local"] + results[1]["local"] == total
    assert all(abs(result["local"] - total / 2) <= 0.05 * total for result in results)


@pytest.mark.parametrize(
    ("sharding_strategy", "sharded"),
    [("SHARD_GRAD_OP", True), ("HYBRID_SHARD", True), ("NO_SHARD", False)],
)
def test_each_sharding_strategy_trains_like_one_process(workers, sharding_strategy, sharded):
    results = workers.run(_train_and_report, {"sharding_strategy": sharding_strategy, "auto_wrap_policy": {Block}})
    _assert_matches_reference(results)
    total = results[0]["total"]
    expected_local = total / 2 if sharded else total
    assert all(abs(result["local"] - expected_local) <= 0.05 * total for result in results)


def test_cpu_offload_trains_like_one_process(workers):
    _assert_matches_reference(workers.run(_train_and_report, {"cpu_offload": True, "auto_wrap_policy": {Block}}))


def test_gradient_clipping_by_norm_uses_the_norm_of_the_whole_gradient(workers):
    clip = 0.05
    _assert_matches_reference(workers.run(_train_and_report, {"auto_wrap_policy": {Block}}, clip), clip=clip)


def _train_checkpointed():
    strategy = make_strategy(auto_wrap_policy={Block}, activation_checkpointing_policy={Block})
    module, optimizer = build(strategy)
    checkpointed = sorted(name for name, sub in module.named_modules() if "checkpoint" in (_get_registry(sub) or {}))
    losses = train(strategy, optimizer, global_batches(STEPS))
    return {"losses": losses, "weights": strategy.module_full_state_dict(), "checkpointed": checkpointed}


def test_activation_checkpointing_wraps_the_chosen_blocks_and_trains_like_one_process(workers):
    results = workers.run(_train_checkpointed)
    _assert_matches_reference(results)
    assert results[0]["checkpointed"] == ["blocks.0", "blocks.1", "blocks.2"]


def _already_checkpointed_by_user():
    strategy = make_strategy(activation_checkpointing_policy={Block, nn.Linear})
    torch.manual_seed(0)
    with strategy.module_init_context():
        module = Net()
        checkpoint(module.blocks[0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        strategy.setup_module(module)
    checkpointed = sorted(name for name, sub in module.named_modules() if "checkpoint" in (_get_registry(sub) or {}))
    return checkpointed, [str(w.message) for w in caught]


def test_activation_checkpointing_already_applied_by_the_user_is_not_applied_again(workers):
    checkpointed, messages = workers.run(_already_checkpointed_by_user)[0]
    assert checkpointed == ["blocks.0"]
    assert any("already has checkpointed submodules" in message for message in messages)


def _train_bf16_mixed():
    strategy = make_strategy(precision="bf16-mixed", auto_wrap_policy={Block})
    module, optimizer = build(strategy)
    seen_dtypes = set()
    module.out.register_forward_hook(lambda mod, args, output: seen_dtypes.add(mod.weight.dtype))
    losses = train(strategy, optimizer, global_batches(8))
    return {
        "losses": losses,
        "compute_dtypes": sorted(map(str, seen_dtypes)),
        "stored_dtypes": sorted({str(p.dtype) for p in module.parameters()}),
    }


def test_bf16_mixed_precision_computes_in_bf16_keeps_fp32_shards_and_trains(workers):
    result = workers.run(_train_bf16_mixed)[0]
    reference_losses, _ = reference_run(global_batches(8))
    assert result["compute_dtypes"] == ["torch.bfloat16"]
    assert result["stored_dtypes"] == ["torch.float32"]
    assert result["losses"][-1] < result["losses"][0]
    assert result["losses"] == pytest.approx(reference_losses, rel=0.05, abs=0.02)


def _train_fp16_mixed():
    strategy = make_strategy(precision="16-mixed", auto_wrap_policy={Block})
    _, optimizer = build(strategy)
    losses = train(strategy, optimizer, global_batches(8))
    scaler = strategy.precision.scaler
    return {"losses": losses, "scale": scaler.get_scale(), "scaler": type(scaler).__name__}


def test_fp16_mixed_precision_scales_gradients_alike_on_every_rank_and_trains(workers):
    results = workers.run(_train_fp16_mixed)
    assert results[0] == results[1]
    assert results[0]["scaler"] == "ShardedGradScaler"
    assert results[0]["scale"] < 2.0**16
    assert results[0]["losses"][-1] < results[0]["losses"][0]


def _accumulate_two_micro_batches():
    strategy = make_strategy(auto_wrap_policy={Block})
    _, optimizer = build(strategy)
    losses = []
    for batch in global_batches(STEPS):
        halves = [tuple(t.chunk(2)[i] for t in batch) for i in range(2)]
        with strategy.no_backward_sync(True):
            first = strategy.run_step("training_step", local_part(halves[0]))
            strategy.backward(first / 2, optimizer)
        second = strategy.run_step("training_step", local_part(halves[1]))
        strategy.backward(second / 2, optimizer)
        strategy.optimizer_step(optimizer)
        strategy.zero_grad(optimizer)
        losses.append(strategy.reduce((first + second).detach() / 2).item())
    return {"losses": losses, "weights": strategy.module_full_state_dict()}


def test_gradient_accumulation_without_sync_trains_like_one_process(workers):
    _assert_matches_reference(workers.run(_accumulate_two_micro_batches))


def _meta_init_weights(empty_init):
    strategy = make_strategy(auto_wrap_policy={Block})
    torch.manual_seed(7)
    with strategy.module_init_context(empty_init=empty_init):
        module = nn.Sequential(Net(), nn.TransformerEncoderLayer(1, 1, dim_feedforward=6, dropout=0.0), _NoReset())
    on_meta = all(p.is_meta for p in module.parameters())
    strategy.setup_module(module)
    return on_meta, strategy.module_full_state_dict()


def test_model_built_on_rank_zero_and_on_meta_elsewhere_starts_from_the_eager_build(workers):
    (rank_zero_on_meta, weights), (rank_one_on_meta, _) = workers.run(_meta_init_weights, None)
    torch.manual_seed(7)
    expected = nn.Sequential(
        Net(), nn.TransformerEncoderLayer(1, 1, dim_feedforward=6, dropout=0.0), _NoReset()
    ).state_dict()
    assert (rank_zero_on_meta, rank_one_on_meta) == (False, True)
    assert weights.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(weights[key], value), key


class _NoReset(nn.Module):
    """Initialised at construction only (no reset_parameters), from the random stream."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.randn(4))


class _UnregisteredTable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.table = torch.randn(4)


def _set_up_a_module_holding_an_unregistered_tensor():
    strategy = make_strategy()
    with strategy.module_init_context():
        module = _UnregisteredTable()
    try:
        strategy.setup_module(module)
    except ValueError as error:
        return str(error)
    return None


def test_a_tensor_outside_parameters_and_buffers_is_refused_on_every_rank_naming_it(workers):
    rank_zero, rank_one = workers.run(_set_up_a_module_holding_an_unregistered_tensor)
    assert rank_zero == rank_one
    assert "rank 1: module.table" in rank_zero
    assert "register_buffer" in rank_zero


def _set_up_a_module_built_differently_per_rank():
    strategy = make_strategy()
    with strategy.module_init_context():
        module = nn.Linear(4, 4 + dist.get_rank())
    try:
        strategy.setup_module(module)
    except ValueError as error:
        return str(error)
    return None


def test_a_module_built_differently_on_another_rank_is_refused_on_every_rank(workers):
    rank_zero, rank_one = workers.run(_set_up_a_module_built_differently_per_rank)
    assert rank_zero == rank_one
    assert "rank 1: weight: ((5, 4)" in rank_zero
    assert "independent of the rank" in rank_zero


def _user_sharded_blocks_stay_as_they_are():
    strategy = make_strategy(auto_wrap_policy={Block, nn.Linear})
    torch.manual_seed(0)
    with strategy.module_init_context():
        module = Net()
        for block in module.blocks:
            fully_shard(block, mesh=strategy.device_mesh)
    states_before = [fully_shard.state(block) for block in module.blocks]
    strategy.setup_module(module)
    [optimizer] = strategy.setup_optimizers([torch.optim.AdamW(module.parameters(), lr=0.05)])
    losses = train(strategy, optimizer, global_batches(STEPS))
    return {
        "same_states": all(fully_shard.state(b) is s for b, s in zip(module.blocks, states_before)),
        "inner_units": sorted(
            name for name, sub in module.named_modules() if isinstance(sub, FSDPModule) and name.startswith("blocks.")
        ),
        "other_units": sorted(
            name
            for name, sub in module.named_modules()
            if isinstance(sub, FSDPModule) and not name.startswith("blocks")
        ),
        "losses": losses,
        "weights": strategy.module_full_state_dict(),
    }


def test_modules_the_user_sharded_are_not_wrapped_again(workers):
    results = workers.run(_user_sharded_blocks_stay_as_they_are)
    _assert_matches_reference(results)
    assert results[0]["same_states"]
    assert results[0]["inner_units"] == ["blocks.0", "blocks.1", "blocks.2"]
    assert results[0]["other_units"] == ["inp", "out"]


def _meshes_of_the_sharding_strategies():
    seen = {}
    for sharding_strategy, options in (
        ("FULL_SHARD", {}),
        ("NO_SHARD", {"sharding_strategy": "NO_SHARD"}),
        ("HYBRID_SHARD", {"sharding_strategy": "HYBRID_SHARD", "device_mesh": (2, 1)}),
    ):
        strategy = make_strategy(**options)
        module, _ = build(strategy)
        mesh = strategy.device_mesh
        seen[sharding_strategy] = {
            "layout": str(strategy.mesh_layout),
            "sharded_over": mesh.mesh_dim_names,
            "shape": tuple(mesh.shape),
            "parameters_on_it": all(parameter.device_mesh == mesh for parameter in module.parameters()),
            "data_ranks": dist.get_world_size(strategy.data_parallel_group),
            "sampler": strategy.distributed_sampler_kwargs,
        }
    return seen


def test_each_sharding_strategy_is_a_layout_of_core_mesh_that_shards_sampling_and_reducing_follow(workers):
    results = workers.run(_meshes_of_the_sharding_strategies)
    shard_only = {"layout": "pp=1, dp_replicate=1, dp_shard=2, tp=1", "sharded_over": ("dp_shard",), "shape": (2,)}
    replicas = {
        "layout": "pp=1, dp_replicate=2, dp_shard=1, tp=1",
        "sharded_over": ("dp_replicate", "dp_shard"),
        "shape": (2, 1),
    }
    for rank, seen in enumerate(results):
        common = {"parameters_on_it": True, "data_ranks": 2, "sampler": {"num_replicas": 2, "rank": rank}}
        assert seen == {
            "FULL_SHARD": shard_only | common,
            "NO_SHARD": replicas | common,
            "HYBRID_SHARD": replicas | common,
        }


def _set_up_twice():
    strategy = make_strategy(auto_wrap_policy={Block})
    module, _ = build(strategy)
    first = strategy.model
    again = strategy.setup_module(module)
    loss = strategy.run_step("training_step", local_part(global_batches(1)[0]))
    return again is first, torch.isfinite(loss).item()


def test_setting_up_the_same_module_again_reuses_its_shards(workers):
    assert workers.run(_set_up_twice) == [(True, True), (True, True)]


def _optimizer_created_before_setup():
    strategy = make_strategy()
    module = Net()
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    strategy.setup_module(module)
    try:
        strategy.setup_optimizers([optimizer])
    except ValueError as error:
        return str(error)
    return None


def test_an_optimizer_created_before_setup_is_refused_with_what_to_do(workers):
    message = workers.run(_optimizer_created_before_setup)[0]
    assert "configure_optimizers" in (message or "")
