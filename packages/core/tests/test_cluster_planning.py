"""Planning for a cluster this machine is not: layouts, devices, the workload of a micro-batch, and what the
module's own tensor-parallel plan splits (measured on torch's fake process group)."""

import re

import pytest
import torch

from stratagem.cli.main import main
from stratagem.demo.llama import LlamaModule
from stratagem.planning import model_footprint
from stratagem.planning.devices import DEVICES, device_spec, parse_size
from stratagem.planning.layouts import coordinates, group_within_node, layouts_for, resolved
from stratagem.planning.rehearsal import sample_ranks, tensor_parallel_split
from stratagem.planning.workload import measure_workload


def test_layouts_of_a_world_size_are_every_factorisation_with_tp_inside_one_node():
    found = layouts_for(("dp_replicate", "dp_shard", "tp"), 16, 8)
    shapes = {(layout["dp_replicate"], layout["dp_shard"], layout["tp"]) for layout in found}
    # 16 = r x s x t with t dividing the 8 devices of a node: t in 1, 2, 4, 8.
    expected = {(r, s, t) for t in (1, 2, 4, 8) for r in (1, 2, 4, 8, 16) for s in (1, 2, 4, 8, 16) if r * s * t == 16}
    assert shapes == expected
    assert all(layout["pp"] == 1 for layout in found)
    assert [layout["dp_replicate"] for layout in layouts_for(("dp_replicate",), 16, 8)] == [16]


def test_a_dimension_is_within_a_node_when_it_and_the_dimensions_inside_it_span_one_node():
    layout = resolved({"dp_shard": -1, "tp": 8}, 64)
    assert layout == {"pp": 1, "dp_replicate": 1, "dp_shard": 8, "tp": 8}
    assert group_within_node(layout, "tp", 8)
    assert not group_within_node(layout, "dp_shard", 8)
    assert coordinates(layout, 13) == {"pp": 0, "dp_replicate": 0, "dp_shard": 1, "tp": 5}
    with pytest.raises(ValueError, match="does not fill 64 ranks"):
        resolved({"dp_shard": 3, "tp": 8}, 64)


def test_the_sample_of_ranks_holds_the_corners_of_the_mesh():
    layout = {"pp": 1, "dp_replicate": 2, "dp_shard": 4, "tp": 8}
    assert sample_ranks(layout, all_ranks=False) == [0]
    # The last rank of each dimension's first group, and the last rank of all.
    assert sample_ranks(layout, all_ranks=True) == [0, 7, 24, 32, 63]


def test_device_memory_takes_binary_and_decimal_units_and_names_a_bad_value():
    assert parse_size("80GiB", "--device-memory") == 80 * 1024**3
    assert parse_size("80 GB", "--device-memory") == 80 * 10**9
    assert parse_size("512MiB", "--device-memory") == 512 * 1024**2
    for bad in ("lots", "-1GiB", "80XB", "0"):
        with pytest.raises(ValueError, match="--device-memory="):
            parse_size(bad, "--device-memory")


def test_an_unknown_device_is_named_with_the_closest_known_one():
    assert device_spec("H100-80GB") is DEVICES["h100-80gb"]
    with pytest.raises(ValueError, match="Did you mean 'h100-80gb'"):
        device_spec("h100-80g")


def test_the_llama_configs_have_meta_s_parameter_counts():
    for size, parameters in (("8b", 8_030_261_248), ("70b", 70_553_706_496)):
        footprint, _ = model_footprint(LlamaModule(size), activations=False)
        assert footprint.parameters == parameters


def test_the_workload_of_a_micro_batch_counts_its_flops_activations_and_block_outputs():
    module = LlamaModule("tiny")
    config = module.config
    workload = measure_workload(module, batch_size=2, seq_len=8)
    tokens = 2 * 8
    assert workload.micro_batch == (2, 8)
    # Every weight but the embedding's multiplies once per token (2 FLOPs a multiply-add), plus attention.
    matmul_weights = workload.footprint.parameters - config.vocab * config.dim - (2 * config.layers + 1) * config.dim
    assert workload.forward_flops >= 2 * tokens * matmul_weights
    assert workload.block_output_bytes == [tokens * config.dim * 4] * config.layers
    assert 0 < sum(workload.block_activation_bytes) < workload.footprint.activation_bytes


def test_token_ids_of_another_shape_than_the_example_input_are_refused():
    module = torch.nn.Linear(4, 4)
    module.example_input_array = torch.zeros(3, 4)
    with pytest.raises(ValueError, match=r"example_input_array is a torch\.float32 tensor of shape \(3, 4\)"):
        measure_workload(module, batch_size=1, seq_len=8)


def test_the_llama_plan_splits_what_torchtitan_splits_over_the_tp_ranks():
    module = LlamaModule("tiny")
    config = module.config
    split = tensor_parallel_split(module, None, 4)
    norms = (2 * config.layers + 1) * config.dim
    assert split.problems == []
    assert split.whole_elements == measure_workload(module).footprint.parameters
    # Everything but the norms is split: embeddings, output, attention and MLP projections.
    assert split.split_elements == split.whole_elements - norms
    assert split.share(4) == pytest.approx((norms + split.split_elements / 4) / split.whole_elements)
    assert split.share(1) == 1.0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--world-size", "12"], "--world-size=12 is not a whole number of nodes of --devices-per-node=8"),
        (["--num-nodes", "2", "--world-size", "8"], "contradicts --num-nodes=2"),
        (["--device", "h100"], "--device='h100' is not a known device"),
        (["--world-size", "8", "--device-memory", "lots"], "--device-memory='lots' is not valid"),
        (["--world-size", "8", "--mfu", "40"], "--mfu=40.0 is not valid"),
        (["--world-size", "8", "--seq-len", "0"], "--seq-len=0 is not valid"),
        # Where stratagem-ddp is not installed (core's own env), auto's default is named as missing first.
        (
            ["--world-size", "8", "--strategies", "single_device"],
            r"No strategy could be planned for 8 ranks|strategy='auto' picks 'ddp', which is provided by stratagem-ddp",
        ),
        (["--world-size", "8", "--auto-wrap", "torch.nn:Nope"], "torch.nn has no nn.Module class named 'Nope'"),
        (["--world-size", "8", "--activation-checkpointing", "Block"], "expected package.module:Class or 'blocks'"),
    ],
    ids=[
        "partial node",
        "contradicting counts",
        "unknown device",
        "bad memory",
        "bad mfu",
        "bad length",
        "none",
        "no such class",
        "not a path",
    ],
)
def test_plan_for_a_cluster_names_a_bad_option(capsys, argv, message):
    assert main(["plan", "stratagem.demo.llama:LlamaModule", *argv]) == 2
    assert re.search(message, capsys.readouterr().err)


class _CountsItsBlocks(torch.nn.Module):
    """Blocks alike, but a forward that fails unless all three run: the dry run must not report it."""

    def __init__(self, blocks: int = 3, fail: bool = False) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(blocks))
        self.fail = fail
        self.seen: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(len(self.layers))
        if self.fail:
            raise RuntimeError("shape mismatch in block 0")
        assert len(self.layers) == 3, "the model counts its blocks"
        for layer in self.layers:
            x = layer(x)
        return x


def test_the_dry_run_forward_runs_one_of_alike_blocks_and_confirms_a_failure_through_all():
    from stratagem.planning.rehearsal import _split_forward_failure
    from stratagem.precision import Precision

    example = torch.zeros(2, 4)
    with torch.device("meta"):
        counting, failing = _CountsItsBlocks(), _CountsItsBlocks(fail=True)
    assert _split_forward_failure(counting, example, Precision()) is None
    assert counting.seen == [1, 3]
    assert len(counting.layers) == 3
    failure = _split_forward_failure(failing, example, Precision())
    assert isinstance(failure, RuntimeError)
    assert str(failure) == "shape mismatch in block 0"
    assert failing.seen == [1, 3]
