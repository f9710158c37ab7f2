import pytest
import torch
from torch import nn

import stratagem
from stratagem.planning import model_footprint
from stratagem_fsdp import FSDPStrategy
from stratagem_fsdp.memory import RELEASING_STEP_TIME


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[nn.Linear(256, 256) for _ in range(8)])
        self.example_input_array = torch.zeros(4, 256)

    def forward(self, x):
        return self.blocks(x)


def _estimate(strategy, devices=2):
    configured = stratagem.resolve(accelerator="cpu", strategy=strategy, devices=devices)
    footprint, _ = model_footprint(Stack())
    return footprint, configured.estimate_memory(footprint)


def test_fsdp_with_units_holds_its_shards_and_two_gathered_units():
    footprint, estimate = _estimate(FSDPStrategy(auto_wrap_policy={nn.Linear}))
    unit = 256 * 256 + 256
    expected = footprint.training_state_bytes // 2 + 2 * 2 * unit * 4 + footprint.activation_bytes
    assert estimate.device_bytes == expected
    assert estimate.relative_step_time > 1.0


def test_fsdp_without_units_gathers_the_whole_model():
    footprint, estimate = _estimate("fsdp")
    assert estimate.device_bytes == footprint.training_state_bytes // 2 + 2 * footprint.parameter_bytes + (
        footprint.activation_bytes
    )


def test_fsdp_cpu_offload_keeps_the_shards_in_host_memory_and_is_declared_slower():
    footprint, sharded = _estimate(FSDPStrategy(auto_wrap_policy={nn.Linear}))
    _, offloaded = _estimate(FSDPStrategy(auto_wrap_policy={nn.Linear}, cpu_offload=True))
    assert offloaded.host_bytes == footprint.training_state_bytes // 2
    assert offloaded.device_bytes == sharded.device_bytes - offloaded.host_bytes
    assert offloaded.relative_step_time > sharded.relative_step_time


def test_fsdp_on_one_process_holds_everything_like_a_replicated_strategy():
    footprint, estimate = _estimate("fsdp", devices=1)
    assert estimate.device_bytes == footprint.training_state_bytes + footprint.activation_bytes


def _available_host_memory(monkeypatch, available):
    import stratagem.strategies.host_allocator as host_allocator

    monkeypatch.setattr(host_allocator, "available_host_bytes", lambda: available)


@pytest.mark.parametrize(("available", "releasing"), [(1 << 40, False), (1 << 20, True)])
def test_on_the_cpu_the_default_releases_freed_memory_only_when_memory_is_tight_and_the_plan_counts_it(
    monkeypatch, available, releasing
):
    _available_host_memory(monkeypatch, available)
    default = stratagem.resolve(accelerator="cpu", strategy=FSDPStrategy(), devices=2)
    keeping = stratagem.resolve(accelerator="cpu", strategy=FSDPStrategy(release_host_memory=False), devices=2)
    assert not keeping.releases_host_memory
    footprint = model_footprint(Stack())[0]
    slower = default.estimate_memory(footprint).relative_step_time
    kept = keeping.estimate_memory(footprint).relative_step_time
    assert slower == pytest.approx(kept * RELEASING_STEP_TIME if releasing else kept)


def test_only_release_host_memory_true_asks_the_allocator_when_the_environment_is_set_up(monkeypatch):
    import stratagem_fsdp.strategy as module

    asked = []
    monkeypatch.setattr(module, "release_freed_host_memory", lambda: asked.append(True) or True)
    for release in (False, None, True):
        strategy = stratagem.resolve(accelerator="cpu", strategy=FSDPStrategy(release_host_memory=release), devices=1)
        monkeypatch.setattr(type(strategy).__mro__[1], "setup_environment", lambda self: None)
        monkeypatch.setattr(module.FSDPStrategy, "_data_parallel_submesh", _stop_after_the_allocator)
        with pytest.raises(pytest.fail.Exception, match="stop after the allocator"):
            strategy.setup_environment()
    assert asked == [True]


def _stop_after_the_allocator(strategy: FSDPStrategy) -> None:
    pytest.fail("stop after the allocator")


@pytest.mark.parametrize(("available", "asked"), [(1 << 40, []), (1 << 20, [True])])
def test_by_default_setting_up_the_module_asks_the_allocator_only_when_its_shards_make_memory_tight(
    monkeypatch, available, asked
):
    import stratagem_fsdp.strategy as module

    _available_host_memory(monkeypatch, available)
    calls = []
    monkeypatch.setattr(module, "release_freed_host_memory", lambda: calls.append(True) or True)
    monkeypatch.setattr(module, "shard_module", lambda *args, **kwargs: pytest.fail("stop before sharding"))
    strategy = stratagem.resolve(accelerator="cpu", strategy=FSDPStrategy(), devices=1)
    strategy._device_mesh = "the mesh, never used: sharding stops first"
    with pytest.raises(pytest.fail.Exception, match="stop before sharding"):
        strategy.setup_module(Stack())
    assert calls == asked
    assert strategy.releases_host_memory == bool(asked)


@pytest.mark.parametrize("value", ["yes", 1, 0.0])
def test_release_host_memory_takes_only_a_boolean_or_none(value):
    with pytest.raises(TypeError, match=r"FSDPStrategy\(release_host_memory="):
        FSDPStrategy(release_host_memory=value)
