import torch
from torch import nn

import stratagem
from stratagem.planning import model_footprint
from stratagem_fsdp import FSDPStrategy


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
