"""FSDPStrategy's options and registrations, checked in the calling process before anything starts."""

import functools
import subprocess
import sys

import pytest
import torch
from fsdp_testing import Block, Net
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy, size_based_auto_wrap_policy

import stratagem
from stratagem import registry
from stratagem.checkpoint_io import TorchCheckpointIO
from stratagem.checkpoint_io.async_io import AsyncCheckpointIO
from stratagem.checkpoint_io.optimizer_state import to_index_keyed, to_name_keyed
from stratagem.precision import MixedPrecision, Precision
from stratagem.strategies import BackwardSyncControl
from stratagem_fsdp import AsyncDistributedCheckpointIO, FSDPStrategy
from stratagem_fsdp.options import ModuleSelector, ShardingLayout, mixed_precision_policy, sharding_layout
from stratagem_fsdp.wrapping import selected_units


def test_strategy_names_and_their_defaults_are_registered():
    for name, defaults in {
        "fsdp": {},
        "fsdp_cpu_offload": {"cpu_offload": True},
        "fsdp_spawn": {"start_method": "spawn"},
        "fsdp_fork": {"start_method": "fork"},
    }.items():
        registration = registry.strategies.get(name)
        assert registration.distribution == "stratagem-fsdp"
        assert dict(registration.defaults) == defaults
        assert registry.strategies.describe(name).available


class _OwnFileIO(TorchCheckpointIO):
    """A user's own one-file IO: in the background, still written by rank 0 alone."""


def test_registering_imports_neither_torch_nor_the_strategy():
    code = (
        "import sys; from stratagem.registry import Registry; import stratagem_fsdp.registration as r; "
        "r.register_strategies(Registry('strategy', 'x')); "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('stratagem_fsdp.')))"
    )
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert output.strip() == "['stratagem_fsdp.registration']"


def test_fsdp_resolves_on_cpu_with_two_processes_and_a_launcher():
    strategy = stratagem.resolve(strategy="fsdp", accelerator="cpu", devices=2)
    assert isinstance(strategy, FSDPStrategy)
    assert strategy.world_size == 2
    assert isinstance(strategy, BackwardSyncControl)
    assert strategy.distributed_sampler_kwargs == {"num_replicas": 2, "rank": 0}
    assert not stratagem.resolve(strategy="fsdp_spawn", accelerator="cpu", devices=2).launcher.caller_is_worker


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"sharding_strategy": "SHARD_EVERYTHING"}, ValueError, "sharding_strategy='SHARD_EVERYTHING'.*'FULL_SHARD'"),
        ({"state_dict_type": "local"}, ValueError, "state_dict_type='local'.*'sharded' or 'full'"),
        ({"cpu_offload": "yes"}, TypeError, "cpu_offload='yes'.*CPUOffloadPolicy"),
        ({"mixed_precision": torch.bfloat16}, TypeError, "mixed_precision=torch.bfloat16.*MixedPrecisionPolicy"),
        ({"auto_wrap_policy": {1}}, TypeError, r"auto_wrap_policy=\{1\}.*nn.Module subclasses"),
        ({"activation_checkpointing_policy": set()}, TypeError, "activation_checkpointing_policy=set()"),
        ({"device_mesh": (1, 2)}, ValueError, "device_mesh=.*only applies to sharding_strategy='HYBRID_SHARD'"),
        ({"sharding_strategy": "HYBRID_SHARD", "device_mesh": (2,)}, ValueError, r"\(replicate, shard\)"),
        ({"start_method": "thread"}, ValueError, "start_method='thread'.*'popen'"),
        ({"reshard_after_forwards": True}, TypeError, "unknown option 'reshard_after_forwards'.*reshard_after_forward"),
        ({"mesh": None}, TypeError, "'mesh' from sharding_strategy and device_mesh"),
        ({"mp_policy": None}, TypeError, "'mp_policy' from mixed_precision"),
    ],
)
def test_invalid_options_are_refused_naming_the_option_value_and_what_is_accepted(options, error, message):
    with pytest.raises(error, match=message):
        FSDPStrategy(**options)


def test_an_unknown_option_given_by_name_is_refused_through_the_registry():
    with pytest.raises(TypeError, match="unknown option 'bogus'"):
        registry.strategies.create("fsdp", bogus=1)


def test_pinned_cpu_offload_is_refused_on_cpu_before_anything_starts():
    strategy = FSDPStrategy(cpu_offload=CPUOffloadPolicy(pin_memory=True))
    with pytest.raises(ValueError, match=r"pin_memory=True\) needs a CUDA device.*cpu_offload=True"):
        stratagem.resolve(strategy=strategy, accelerator="cpu", devices=2)


def test_a_hybrid_mesh_that_does_not_cover_the_processes_is_refused_at_resolve():
    strategy = FSDPStrategy(sharding_strategy="HYBRID_SHARD", device_mesh=(2, 2))
    with pytest.raises(ValueError, match=r"device_mesh=\(2, 2\) has 4 ranks, but the run has 2 processes"):
        stratagem.resolve(strategy=strategy, accelerator="cpu", devices=2)


def test_a_full_state_dict_with_the_sharded_checkpoint_io_plugin_is_refused_at_resolve():
    with pytest.raises(ValueError, match="state_dict_type='full' writes one file from rank 0"):
        stratagem.resolve(
            strategy=FSDPStrategy(state_dict_type="full"),
            accelerator="cpu",
            devices=2,
            plugins="distributed_checkpoint",
        )


@pytest.mark.parametrize("plugins", ["torch", AsyncCheckpointIO(_OwnFileIO())], ids=["torch", "async_of_own_io"])
def test_a_checkpoint_io_called_by_rank_0_alone_is_refused_for_sharded_checkpoints_at_construction(plugins):
    refusal = (
        r"FSDPStrategy\(.*state_dict_type='sharded'.*\) cannot save through the checkpoint IO \w+: .* rank 0 alone"
    )
    with pytest.raises(ValueError, match=refusal):
        stratagem.Trainer(strategy="fsdp", accelerator="cpu", devices=2, plugins=plugins)


def test_plugins_async_saves_sharded_checkpoints_through_dcps_async_save():
    strategy = stratagem.resolve(strategy="fsdp", accelerator="cpu", devices=2, plugins="async")
    assert isinstance(strategy.checkpoint_io, AsyncDistributedCheckpointIO)
    assert strategy.checkpoint_io.writes_collectively


def test_sharded_checkpoints_go_through_the_collective_io_and_full_ones_through_a_rank_0_io():
    sharded = stratagem.resolve(strategy="fsdp", accelerator="cpu", devices=2)
    assert sharded.checkpoint_io.writes_collectively
    full = stratagem.resolve(
        strategy=FSDPStrategy(state_dict_type="full"), accelerator="cpu", devices=2, plugins="async"
    )
    assert type(full.checkpoint_io).__name__ == "AsyncCheckpointIO"


def test_torch_sharding_strategy_members_and_any_case_are_accepted():
    assert FSDPStrategy(sharding_strategy=ShardingStrategy.SHARD_GRAD_OP).sharding_strategy == "SHARD_GRAD_OP"
    assert FSDPStrategy(sharding_strategy="hybrid_shard").sharding_strategy == "HYBRID_SHARD"


def test_each_sharding_strategy_maps_to_a_mesh_and_a_reshard_choice():
    assert sharding_layout("FULL_SHARD", 4, 2, None) == ShardingLayout((4,), reshard_after_forward=True)
    assert sharding_layout("SHARD_GRAD_OP", 4, 2, None) == ShardingLayout((4,), reshard_after_forward=False)
    assert sharding_layout("NO_SHARD", 4, 2, None) == ShardingLayout((4, 1), reshard_after_forward=False)
    assert sharding_layout("HYBRID_SHARD", 4, 2, None) == ShardingLayout((2, 2), reshard_after_forward=True)
    assert sharding_layout("HYBRID_SHARD", 4, 1, (4, 1)).mesh_shape == (4, 1)
    assert sharding_layout("NO_SHARD", 4, 1, None).mesh_dim_names == ("replicate", "shard")


def test_mixed_precision_is_derived_from_the_trainer_precision_unless_given():
    derived = mixed_precision_policy(None, MixedPrecision("bfloat16"))
    assert (derived.param_dtype, derived.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert mixed_precision_policy(None, Precision()).param_dtype is None
    given = MixedPrecisionPolicy(param_dtype=torch.float16)
    assert mixed_precision_policy(given, MixedPrecision("bfloat16")) is given


def test_wrap_policies_in_every_accepted_form_pick_the_same_blocks():
    net = Net(width=16, depth=2)
    forms = [{Block}, [Block], lambda module: isinstance(module, Block), ModuleWrapPolicy({Block})]
    for form in forms:
        selector = ModuleSelector.from_option("auto_wrap_policy", form)
        assert selector is not None
        assert selected_units(net, selector) == list(net.blocks), form


def test_size_based_policy_counts_only_parameters_not_already_in_a_unit():
    net = nn.Sequential(nn.Sequential(nn.Linear(10, 10), nn.Linear(10, 10)), nn.Linear(2, 2))
    selector = ModuleSelector.from_option(
        "auto_wrap_policy", functools.partial(size_based_auto_wrap_policy, min_num_params=110)
    )
    assert selector is not None
    assert selected_units(net, selector) == [net[0][0], net[0][1]]


def test_optimizer_state_converts_between_index_and_name_keys_without_loss():
    net = Net()
    optimizer = torch.optim.AdamW([{"params": net.inp.parameters()}, {"params": net.out.parameters(), "lr": 0.1}])
    net(torch.randn(2, 5)).sum().backward()
    optimizer.step()
    state = optimizer.state_dict()
    names = ["inp.weight", "inp.bias", "out.weight", "out.bias"]
    named = to_name_keyed(state, names)
    assert named["param_groups"][1]["params"] == ["out.weight", "out.bias"]
    assert set(named["state"]) == set(names)
    assert to_index_keyed(named) == state


def test_parallel_options_given_to_fsdp_reach_parallel_strategy_and_the_rest_go_to_fully_shard():
    strategy = FSDPStrategy(timeout=9, start_method="spawn", process_group_backend="gloo", reshard_after_forward=False)
    assert (strategy.timeout.total_seconds(), strategy.start_method, strategy.process_group_backend) == (
        9,
        "spawn",
        "gloo",
    )
    assert strategy._fully_shard_kwargs == {"reshard_after_forward": False}
    assert registry.strategies.create("fsdp_spawn", timeout=13).timeout.total_seconds() == 13
