import pytest
import torch
from torch import nn

import stratagem
from stratagem.planning import model_footprint
from stratagem_deepspeed import DeepSpeedStrategy


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[nn.Linear(512, 512) for _ in range(8)])
        self.example_input_array = torch.zeros(4, 512)

    def forward(self, x):
        return self.blocks(x)


@pytest.fixture(scope="module")
def footprint():
    return model_footprint(Stack())[0]


def _estimate(footprint, **options):
    strategy = stratagem.resolve(accelerator="cpu", strategy=DeepSpeedStrategy(**options), devices=2)
    return strategy.estimate_memory(footprint)


def test_each_zero_stage_holds_less_per_rank_than_the_one_before(footprint):
    held = [_estimate(footprint, stage=stage).device_bytes for stage in (1, 2, 3)]
    assert held[0] > held[1] > held[2]


def test_stage_3_holds_a_parameter_shard_plus_the_gathered_blocks(footprint):
    estimate = _estimate(footprint, stage=3)
    elements = footprint.parameters
    trainable_bytes = footprint.gradient_bytes
    gathered = 2 * footprint.largest_unit_bytes
    bucket = elements * 4  # the reduce bucket (200M elements) is larger than this model
    expected = (
        footprint.parameter_bytes / 2 + gathered + trainable_bytes / 2 * (1 + 2) + trainable_bytes / 2 + bucket
    ) + footprint.activation_bytes
    assert estimate.device_bytes == int(expected)


def test_offloading_moves_the_optimizer_state_and_then_the_parameters_to_host_memory(footprint):
    stage_3 = _estimate(footprint, stage=3)
    optimizer_offloaded = _estimate(footprint, stage=3, offload_optimizer=True)
    everything_offloaded = _estimate(footprint, stage=3, offload_optimizer=True, offload_parameters=True)
    assert optimizer_offloaded.host_bytes > 0
    assert everything_offloaded.host_bytes > optimizer_offloaded.host_bytes
    assert stage_3.device_bytes > optimizer_offloaded.device_bytes > everything_offloaded.device_bytes
    assert stage_3.device_bytes + stage_3.host_bytes == everything_offloaded.device_bytes + (
        everything_offloaded.host_bytes
    )
    assert stage_3.relative_step_time < optimizer_offloaded.relative_step_time < everything_offloaded.relative_step_time


def test_bf16_halves_the_parameters_but_adds_fp32_master_gradients(footprint):
    fp32 = stratagem.resolve(accelerator="cpu", strategy=DeepSpeedStrategy(stage=3), devices=2)
    bf16 = stratagem.resolve(accelerator="cpu", strategy=DeepSpeedStrategy(stage=3), devices=2, precision="bf16-mixed")
    fp32_estimate, bf16_estimate = fp32.estimate_memory(footprint), bf16.estimate_memory(footprint)
    assert bf16_estimate.device_bytes < fp32_estimate.device_bytes


def test_auto_chooses_zero_3_when_only_zero_3_fits_and_says_what_stage_2_would_need(footprint, monkeypatch):
    from stratagem.planning import Resources
    from stratagem.planning.auto import AutoRequest, choose_strategy

    stage_3 = _estimate(footprint, stage=3).device_bytes
    room = Resources(host_memory_bytes=int(2 * stage_3 / 0.85) + 1024, device_memory_bytes=None, disk_bytes=2**40)
    monkeypatch.setattr("stratagem.planning.planner.visible_resources", lambda *_: room)
    monkeypatch.delenv("STRATAGEM_AUTO_STRATEGY", raising=False)
    name, reason = choose_strategy(Stack(), AutoRequest("cpu", 2, 1, None, None), "deepspeed_stage_2")
    assert name == "deepspeed_stage_3"
    assert reason is not None
    assert reason.startswith("auto → deepspeed_stage_3: ")
    assert "deepspeed_stage_2 would need" in reason
