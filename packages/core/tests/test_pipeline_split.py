"""Cutting a module into pipeline stages: the split, the schedules' checks, the stage modules in one process, and
what the planner counts of a pipeline rank."""

import copy

import pytest
import torch
from torch import nn

from stratagem.pipelining import SCHEDULES, StageBlocks, check_schedule, keep_stages, split_module, stage_view
from stratagem.pipelining.memory import (
    PipelineShape,
    bubble_fraction,
    chunks_in_flight,
    pipeline_estimate,
    stage_parameters,
)
from stratagem.pipelining.schedules import rank_stages, schedule_kind, stage_rank
from stratagem.planning import model_footprint


class Decoder(nn.Module):
    def __init__(self, depth: int = 5) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.scale = nn.Parameter(torch.ones(4))
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(depth))
        self.norm = nn.LayerNorm(4)
        self.head = nn.Linear(4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x) * self.scale
        for layer in self.layers:
            x = torch.tanh(layer(x))
        if self.head is not None:
            x = self.head(self.norm(x))
        return x


class Wrapped(nn.Module):
    """A block list one level down, as Hugging Face's ``model.layers``."""

    def __init__(self) -> None:
        super().__init__()
        self.model = Decoder(4)
        self.lm_head = nn.Linear(10, 3)


def test_blocks_are_divided_evenly_with_embeddings_first_and_the_head_last():
    split = split_module(Decoder(5), 2)
    assert split.blocks == "layers"
    assert split.stage_blocks == ((0, 1, 2), (3, 4))
    assert split.pieces(0) == ["scale", "embed", "layers.0", "layers.1", "layers.2"]
    assert split.pieces(1) == ["layers.3", "layers.4", "norm", "head"]
    assert split.split_points() == ["layers.3"]


def test_split_points_cut_where_they_name_and_nested_block_lists_keep_their_ends():
    assert split_module(Decoder(5), 3, ["layers.1", "layers.4"]).stage_blocks == ((0,), (1, 2, 3), (4,))
    split = split_module(Wrapped(), 2, ["model.layers.1"])
    assert split.pieces(0) == ["model.scale", "model.embed", "model.layers.0"]
    assert split.pieces(1) == [
        "model.layers.1",
        "model.layers.2",
        "model.layers.3",
        "model.norm",
        "model.head",
        "lm_head",
    ]


@pytest.mark.parametrize(
    ("stages", "points", "message"),
    [
        (6, None, r"6 stages but 'layers' holds 5 block\(s\)"),
        (2, ["layers.7"], r"'layers.7', which does not exist: 'layers' holds blocks layers.0 to layers.4"),
        (2, ["blocks.2"], r"blocks 'blocks' do not exist in Decoder; its lists of blocks are \['layers'\]"),
        (3, ["layers.3", "layers.2"], r"leaves a stage without blocks at 'layers.2'"),
        (2, ["layers.0"], r"leaves a stage without blocks at 'layers.0'"),
        (3, ["layers.2"], r"cuts the model into 2 stages, but the pipeline has 3"),
        (2, ["head"], r"'head', which is not a block of a list of blocks"),
        (2, ["norm.0"], r"'norm' are a LayerNorm, not an nn.ModuleList"),
    ],
)
def test_a_split_that_cannot_work_is_refused_naming_the_blocks(stages, points, message):
    with pytest.raises(ValueError, match=message):
        split_module(Decoder(5), stages, points)


def test_tied_weights_across_stages_are_refused():
    model = Decoder(2)
    model.head.weight = model.embed.weight
    with pytest.raises(ValueError, match=r"'head.weight' \(stage 1\) is the same tensor as 'embed.weight' \(stage 0\)"):
        split_module(model, 2)


def test_the_split_works_on_the_meta_device():
    with torch.device("meta"):
        assert split_module(Decoder(4), 4).stage_blocks == ((0,), (1,), (2,), (3,))


def test_stage_views_chained_compute_what_the_whole_module_does_and_keep_the_whole_model_s_names():
    torch.manual_seed(0)
    whole = Decoder(5)
    tokens = torch.randint(0, 10, (3, 2))
    expected = whole(tokens)
    split = split_module(whole, 3)
    kept = copy.deepcopy(whole)
    keep_stages(kept, split, [0, 2])
    assert isinstance(kept.layers, StageBlocks)
    assert list(kept.state_dict()) == [
        name for name in whole.state_dict() if not name.startswith(("layers.2.", "layers.3."))
    ]
    middle = copy.deepcopy(whole)
    keep_stages(middle, split, [1])
    assert (middle.embed, middle.head, middle.scale) == (None, None, None)
    views = [stage_view(kept, split, 0), stage_view(middle, split, 1), stage_view(kept, split, 2)]
    x = tokens
    for view in views:
        x = view(x)
    torch.testing.assert_close(x, expected, rtol=0, atol=0)
    # Views share the kept module's blocks; the kept module itself is unchanged by making them.
    assert views[0].layers[0] is kept.layers[0]
    assert views[0].head is None
    assert kept.head is not None


def test_every_schedule_names_a_torch_class_and_places_every_stage_once():
    for name, kind in SCHEDULES.items():
        assert isinstance(kind.torch_schedule(), type), name
        per_rank = kind.default_stages_per_rank()
        placed = sorted(stage for rank in range(4) for stage in rank_stages(kind, rank, 4, per_rank))
        assert placed == list(range(4 * per_rank)), name
        assert all(
            stage_rank(kind, stage, 4) == rank for rank in range(4) for stage in rank_stages(kind, rank, 4, per_rank)
        )


@pytest.mark.parametrize(
    ("name", "pp", "per_rank", "micro", "message"),
    [
        ("1fb1", 2, None, 2, r"'1fb1' is not a schedule. Did you mean '1f1b'\?"),
        ("1f1b", 4, None, 2, r"at least as many micro-batches as stages: micro_batches=2 with pp=4"),
        ("gpipe", 2, 2, 2, r"'gpipe' runs one stage per rank, not stages_per_rank=2"),
        ("zbv_zero_bubble", 2, 3, 4, r"exactly 2 stages per rank"),
        ("interleaved_1f1b", 2, 2, 5, r"micro_batches=5 is not a multiple of its 2 rounds"),
        ("gpipe", 2, None, 0, r"micro_batches=0 is not valid"),
    ],
)
def test_a_schedule_torch_cannot_run_is_refused_before_launch(name, pp, per_rank, micro, message):
    with pytest.raises(ValueError, match=message):
        check_schedule(name, pp, per_rank, micro)


def test_interleaved_schedules_hold_two_stages_per_rank_by_default():
    assert check_schedule("interleaved_1f1b", 2, None, 4) == 2
    assert check_schedule("1f1b", 2, None, 2) == 1
    assert schedule_kind("zbv_zero_bubble").layout == "v"


def _shape(name: str, pp: int = 2, micro_batches: int = 8, per_rank: int | None = None) -> PipelineShape:
    kind = schedule_kind(name)
    return PipelineShape(kind, pp, per_rank or kind.default_stages_per_rank(), micro_batches)


def test_the_estimate_counts_the_busiest_stage_s_parameters_and_the_schedule_s_micro_batches_in_flight():
    module = Decoder(4)
    module.example_input_array = torch.zeros(8, 3, dtype=torch.long)
    footprint, _ = model_footprint(module)
    assert footprint.activation_bytes > 0
    split = split_module(footprint.module, 2)
    sizes = stage_parameters(footprint.module, split)
    assert sum(sizes) == footprint.parameters
    assert sizes[0] == sum(p.numel() for p in (module.embed.weight, module.scale, *module.layers[:2].parameters()))
    gpipe = pipeline_estimate(footprint, _shape("gpipe"), split)
    one_f_one_b = pipeline_estimate(footprint, _shape("1f1b"), split)
    whole = footprint.training_state_bytes + footprint.activation_bytes
    assert one_f_one_b.device_bytes < gpipe.device_bytes < whole
    assert (chunks_in_flight(_shape("gpipe")), chunks_in_flight(_shape("1f1b"))) == (8, 2)
    assert chunks_in_flight(_shape("looped_bfs")) == 16
    # The bubble shrinks with more micro-batches and with zero-bubble schedules.
    assert bubble_fraction(_shape("1f1b", micro_batches=8)) < bubble_fraction(_shape("1f1b", micro_batches=2))
    assert bubble_fraction(_shape("interleaved_zero_bubble")) < bubble_fraction(_shape("interleaved_1f1b"))
    assert one_f_one_b.relative_step_time == pytest.approx(1 / (1 - 1 / 9))
