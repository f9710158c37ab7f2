import os

import pytest
import torch
from torch import nn

import stratagem
from stratagem.planning import model_footprint
from stratagem_deepspeed import DeepSpeedStrategy
from stratagem_deepspeed.buffer_sizes import (
    GPU_BUCKET_ELEMENTS,
    MIN_CPU_BUCKET_ELEMENTS,
    cpu_bucket_elements,
    fitted_sizes,
    gpu_sizes,
)
from stratagem_deepspeed.memory import RELEASING_STEP_TIME


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[nn.Linear(512, 512) for _ in range(8)])
        self.example_input_array = torch.zeros(4, 512)

    def forward(self, x):
        return self.blocks(x)


class WideStack(stratagem.Module):
    """134M parameters, built only on the meta device by the planner (configure_model)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks: nn.Sequential | None = None

    def configure_model(self) -> None:
        self.blocks = nn.Sequential(*[nn.Linear(4096, 4096) for _ in range(8)])

    def forward(self, x):
        return self.blocks(x)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters())


WIDE_ELEMENTS = 8 * (4096 * 4096 + 4096)
WIDE_LARGEST_PARAMETER = 4096 * 4096
WIDE_BLOCK = 4096 * 4096 + 4096


@pytest.fixture(scope="module")
def footprint():
    return model_footprint(Stack())[0]


@pytest.fixture(scope="module")
def wide():
    return model_footprint(WideStack())[0]


def _estimate(footprint, precision="32-true", **options):
    strategy = stratagem.resolve(
        accelerator="cpu", strategy=DeepSpeedStrategy(**options), devices=2, precision=precision
    )
    return strategy.estimate_memory(footprint)


def test_each_zero_stage_holds_less_per_rank_than_the_one_before(wide):
    held = [_estimate(wide, stage=stage).device_bytes for stage in (1, 2, 3)]
    assert held[0] > held[1] > held[2]


def test_stage_3_on_the_cpu_counts_its_shards_and_the_buffers_sized_to_the_largest_parameter(wide):
    estimate = _estimate(wide, stage=3)
    bucket = WIDE_LARGEST_PARAMETER  # between the CPU's smallest bucket and the GPU default
    shard = WIDE_ELEMENTS * 4 / 2
    parameters, master, gradients, adam = shard, shard, shard, 2 * shard
    # At least two blocks gathered (here a little more than stage3_max_live_parameters, two buckets).
    gathered = 2 * WIDE_BLOCK * 4
    adam_step_temporaries = 2 * bucket * 4  # one sub-group (a bucket) at a time, one temporary per state
    reduce_bucket = bucket * 4
    expected = parameters + master + gradients + adam + gathered + adam_step_temporaries + reduce_bucket
    assert estimate.device_bytes == int(expected + wide.activation_bytes)


def test_the_reduce_bucket_is_counted_whole_even_when_the_model_is_smaller(footprint):
    small_bucket = _estimate(footprint, stage=2, reduce_bucket_size=1_000_000).device_bytes
    large_bucket = _estimate(footprint, stage=2, reduce_bucket_size=100_000_000).device_bytes
    assert footprint.parameters < 100_000_000
    assert large_bucket - small_bucket == 99_000_000 * 4


def test_cpu_sizes_follow_the_largest_parameter_between_a_floor_and_the_gpu_default():
    assert cpu_bucket_elements(1_000) == MIN_CPU_BUCKET_ELEMENTS
    assert cpu_bucket_elements(30_000_000) == 30_000_000
    assert cpu_bucket_elements(10**10) == GPU_BUCKET_ELEMENTS
    zero = fitted_sizes({"zero_optimization": {"stage": 3}}, 30_000_000)["zero_optimization"]
    assert zero == {
        "stage": 3,
        "reduce_bucket_size": 30_000_000,
        "allgather_bucket_size": 30_000_000,
        "stage3_prefetch_bucket_size": 30_000_000,
        "stage3_max_reuse_distance": 30_000_000,
        "stage3_max_live_parameters": 60_000_000,
        "sub_group_size": 30_000_000,
    }


def test_sizes_the_config_sets_are_kept_and_stages_below_3_get_no_sub_groups():
    config = {"zero_optimization": {"stage": 2, "reduce_bucket_size": 123, "stage3_max_live_parameters": 7}}
    zero = fitted_sizes(config, 30_000_000)["zero_optimization"]
    assert zero["reduce_bucket_size"] == 123
    assert zero["stage3_max_live_parameters"] == 7
    assert zero["allgather_bucket_size"] == 30_000_000
    assert "sub_group_size" not in zero
    assert config["zero_optimization"] == {"stage": 2, "reduce_bucket_size": 123, "stage3_max_live_parameters": 7}


def test_off_the_cpu_the_buckets_keep_lightnings_default_and_given_ones_stay():
    zero = gpu_sizes({"zero_optimization": {"stage": 3, "reduce_bucket_size": 5}})["zero_optimization"]
    assert zero == {"stage": 3, "reduce_bucket_size": 5, "allgather_bucket_size": GPU_BUCKET_ELEMENTS}


def test_the_strategy_leaves_unset_buckets_out_of_its_config_until_it_knows_the_model():
    strategy = stratagem.resolve(accelerator="cpu", strategy=DeepSpeedStrategy(stage=3), devices=2)
    assert "reduce_bucket_size" not in strategy.config["zero_optimization"]
    given = stratagem.resolve(accelerator="cpu", strategy=DeepSpeedStrategy(stage=3, reduce_bucket_size=5e6), devices=2)
    assert given.config["zero_optimization"]["reduce_bucket_size"] == 5_000_000


def _nvme_estimate(footprint, nvme_path, precision="32-true"):
    """Stage 3 with parameters and optimizer state offloaded to NVMe."""
    return _estimate(
        footprint,
        precision=precision,
        stage=3,
        offload_optimizer=True,
        offload_parameters=True,
        offload_optimizer_device="nvme",
        offload_params_device="nvme",
        nvme_path=str(nvme_path),
    )


def test_nvme_offload_counts_page_locked_swap_buffers_in_host_memory_and_the_states_on_disk(wide, tmp_path):
    estimate = _nvme_estimate(wide, tmp_path, precision="bf16-mixed")
    bucket = WIDE_LARGEST_PARAMETER
    shard = WIDE_ELEMENTS / 2
    parameter_swap_buffers = 5 * 100_000_000 * 2  # DeepSpeed's defaults, in bf16
    optimizer_swap_buffers = 4 * bucket * 4  # buffer_count x the sub-group, fp32
    adam_step_temporaries = 2 * bucket * 4
    parameters_kept_in_host = shard * 2  # below max_in_cpu (1e9), DeepSpeed keeps them in host memory too
    gradients = shard * 2 + shard * 4  # bf16, and the fp32 partition the optimizer steps
    assert estimate.host_bytes == int(
        parameters_kept_in_host + parameter_swap_buffers + optimizer_swap_buffers + adam_step_temporaries + gradients
    )
    assert estimate.disk_bytes == int(shard * 4 * 3)  # fp32 master weights and AdamW's two states
    gathered = 2 * WIDE_BLOCK * 2
    training = gathered + bucket * 2 + wide.activation_bytes
    # At the fit's end the whole bf16 model is gathered; the step's temporaries, the window and activations are gone.
    end_of_fit_excess = WIDE_ELEMENTS * 2 - adam_step_temporaries - gathered - wide.activation_bytes
    assert estimate.device_bytes == int(training + max(0, end_of_fit_excess))


def test_stage_3_counts_the_end_of_the_fit_where_every_rank_gathers_the_whole_model(wide, tmp_path):
    estimate = _nvme_estimate(wide, tmp_path)
    bucket = WIDE_LARGEST_PARAMETER
    shard = WIDE_ELEMENTS / 2
    temporaries = 2 * bucket * 4
    gathered = 2 * WIDE_BLOCK * 4
    host = shard * 4 + 5 * 100_000_000 * 4 + 4 * bucket * 4 + temporaries + shard * 4
    device = gathered + bucket * 4 + wide.activation_bytes
    # NVMe keeps its swap buffers and the partitions it holds in host memory; the whole fp32 model joins them.
    end_of_fit = host + device - temporaries - gathered - wide.activation_bytes + WIDE_ELEMENTS * 4
    assert end_of_fit > host + device
    assert estimate.host_bytes == int(host)
    assert estimate.device_bytes + estimate.host_bytes == int(end_of_fit)


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


def test_auto_chooses_zero_3_when_only_zero_3_fits_and_says_what_stage_2_would_need(wide, monkeypatch):
    from stratagem.planning import Resources
    from stratagem.planning.auto import choose_strategy

    stage_3 = _estimate(wide, stage=3).device_bytes
    room = Resources(host_memory_bytes=int(2 * stage_3 / 0.85) + 1024, device_memory_bytes=None, disk_bytes=2**40)
    monkeypatch.setattr("stratagem.planning.planner.visible_resources", lambda *_: room)
    monkeypatch.delenv("STRATAGEM_AUTO_STRATEGY", raising=False)
    name, reason = choose_strategy(WideStack(), {"accelerator": "cpu", "devices": 2}, "deepspeed_stage_2")
    assert name == "deepspeed_stage_3"
    assert reason is not None
    assert reason.startswith("auto → deepspeed_stage_3: ")
    assert "deepspeed_stage_2 would need" in reason


def test_on_the_cpu_ranks_return_freed_memory_by_default_and_the_plan_counts_the_slower_step(footprint):
    releasing = stratagem.resolve(accelerator="cpu", strategy=DeepSpeedStrategy(stage=3), devices=2)
    keeping = stratagem.resolve(
        accelerator="cpu", strategy=DeepSpeedStrategy(stage=3, release_host_memory=False), devices=2
    )
    assert releasing.releases_host_memory
    assert not keeping.releases_host_memory
    slower = releasing.estimate_memory(footprint).relative_step_time
    assert slower == pytest.approx(keeping.estimate_memory(footprint).relative_step_time * RELEASING_STEP_TIME)


def test_setting_up_a_releasing_rank_asks_the_allocator_to_return_freed_memory(monkeypatch):
    import stratagem_deepspeed.strategy as module

    asked = []
    monkeypatch.setattr(module, "release_freed_host_memory", lambda: asked.append(True))
    for release in (False, None):
        strategy = stratagem.resolve(
            accelerator="cpu", strategy=DeepSpeedStrategy(stage=3, release_host_memory=release), devices=1
        )
        monkeypatch.setattr(type(strategy).__mro__[1], "setup_environment", lambda self: None)
        # setup_environment exports the rank for DeepSpeed; the test's process keeps its own variables.
        monkeypatch.setattr(os, "environ", dict(os.environ))
        monkeypatch.setattr(module, "import_deepspeed", lambda: pytest.fail("stop after the allocator"))
        with pytest.raises(pytest.fail.Exception, match="stop after the allocator"):
            strategy.setup_environment()
    assert asked == [True]


@pytest.mark.parametrize("value", ["yes", 1, 0.0])
def test_release_host_memory_takes_only_a_boolean_or_none(value):
    with pytest.raises(TypeError, match="release_host_memory"):
        DeepSpeedStrategy(release_host_memory=value)
