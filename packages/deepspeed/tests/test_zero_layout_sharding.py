"""What ZeRO declares for cluster planning: each stage's shards, its fp32 master copy and its offloads."""

import pytest

from stratagem.demo.llama import LlamaModule
from stratagem.planning.cluster import ClusterTarget, plan_cluster
from stratagem.planning.devices import device_spec
from stratagem.precision.mixed import MixedPrecision
from stratagem_deepspeed.strategy import DeepSpeedStrategy


@pytest.mark.parametrize(
    ("options", "sharded", "offloaded"),
    [
        ({"stage": 1}, {"optimizer_state"}, set()),
        ({"stage": 2}, {"optimizer_state", "gradients"}, set()),
        ({"stage": 3}, {"optimizer_state", "gradients", "parameters"}, set()),
        ({"stage": 2, "offload_optimizer": True}, {"optimizer_state", "gradients"}, {"optimizer_state", "gradients"}),
        (
            {"stage": 3, "offload_optimizer": True, "offload_parameters": True},
            {"optimizer_state", "gradients", "parameters"},
            {"optimizer_state", "gradients", "parameters"},
        ),
    ],
    ids=["stage 1", "stage 2", "stage 3", "stage 2 offload", "stage 3 offload"],
)
def test_each_zero_stage_declares_what_it_shards_and_offloads(options, sharded, offloaded):
    declared = DeepSpeedStrategy(**options).layout_sharding(devices_per_node=8)
    assert declared.dimensions == ("dp_shard",)
    assert declared.sharded == sharded
    assert declared.offloaded == offloaded
    assert declared.master_copy


def test_zero_3_in_bf16_holds_the_zero_papers_16_bytes_per_parameter_over_the_ranks():
    # bf16 parameters and gradients (2 + 2 bytes) and an fp32 master copy with Adam's two moments (12 bytes).
    module = LlamaModule("tiny")
    target = ClusterTarget(16, 8, device_spec("h100-80gb"))
    precision = MixedPrecision("bfloat16")
    plan = plan_cluster(module, {"deepspeed_stage_3": DeepSpeedStrategy(stage=3)}, target, precision, 1, 16)
    (candidate,) = plan.candidates
    parameters = plan.workload.footprint.parameters
    assert candidate.memory.model_state == pytest.approx(16 * parameters / 16, rel=1e-6)
    assert candidate.memory.parameters == pytest.approx(2 * parameters / 16, rel=1e-6)


def test_without_zero_the_data_parallel_ranks_all_reduce_whole_gradients_as_ddp_does():
    module = LlamaModule("tiny")
    target = ClusterTarget(16, 8, device_spec("h100-80gb"))
    plan = plan_cluster(module, {"deepspeed": DeepSpeedStrategy(stage=0)}, target, None, 1, 16)
    (candidate,) = plan.candidates
    footprint = plan.workload.footprint
    assert candidate.memory.model_state == footprint.training_state_bytes
    links = target.device.inter_node_bytes_per_s
    assert candidate.step.data_parallel == pytest.approx(2 * 15 / 16 * footprint.gradient_bytes / links)
