"""The named parallel layout: sizes checked against the world size, and the data-parallel coordinates."""

import pytest

import stratagem
from stratagem.mesh import MeshLayout, parse_layout


def test_minus_one_and_auto_take_the_ranks_the_other_dimensions_leave():
    assert MeshLayout(dp_shard=-1, tp=2).resolved(8).shape == (1, 1, 4, 2)
    assert MeshLayout(dp_replicate="auto", dp_shard=2, tp=2).resolved(8).shape == (1, 2, 2, 2)
    assert MeshLayout(dp_replicate=2, dp_shard=2, tp=1).resolved(4).shape == (1, 2, 2, 1)


def test_data_parallel_ranks_count_tensor_parallel_neighbours_once():
    layout = MeshLayout(dp_replicate=2, dp_shard=2, tp=2).resolved(8)
    assert layout.data_parallel_size == 4
    assert [layout.data_parallel_rank(rank) for rank in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]


@pytest.mark.parametrize(
    ("sizes", "world_size", "message"),
    [
        ({"dp_shard": 3, "tp": 2}, 4, r"\(pp=1, dp_replicate=1, dp_shard=3, tp=2\).*multiply to 6, not to the 4"),
        ({"dp_shard": -1, "tp": 3}, 4, r"multiply to 3, which does not divide the 4 processes"),
    ],
)
def test_a_layout_that_does_not_fill_the_world_names_its_sizes_and_what_fits(sizes, world_size, message):
    with pytest.raises(ValueError, match=message):
        MeshLayout(**sizes).resolved(world_size)


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        ({"tp": 0}, r"tp=0 is not a valid mesh size; expected a positive int, or -1 / 'auto'"),
        ({"dp_shard": 2.0}, r"dp_shard=2.0 is not a valid mesh size"),
        ({"tp": True}, r"tp=True is not a valid mesh size"),
        ({"dp_replicate": -1, "dp_shard": -1}, r"dp_replicate=-1 and dp_shard=-1: at most one"),
    ],
)
def test_invalid_sizes_are_refused_when_the_layout_is_made(sizes, message):
    with pytest.raises(ValueError, match=message):
        MeshLayout(**sizes)


def test_pipeline_stages_are_outermost_and_data_parallel_ranks_repeat_in_every_stage():
    layout = MeshLayout(pp=2, dp_shard=-1, tp=2).resolved(8)
    assert layout.dim_names == ("pp", "dp_replicate", "dp_shard", "tp")
    assert layout.shape == (2, 1, 2, 2)
    assert [layout.pipeline_rank(rank) for rank in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [layout.data_parallel_rank(rank) for rank in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]


def test_a_pipeline_that_does_not_fit_the_world_is_refused_naming_pp():
    with pytest.raises(ValueError, match=r"\(pp=3, dp_replicate=1, dp_shard=-1, tp=1\).*does not divide the 4"):
        MeshLayout(pp=3).resolved(4)
    with pytest.raises(ValueError, match=r"pp=0 is not a valid mesh size"):
        MeshLayout(pp=0)


def test_a_layout_is_given_as_text_a_dict_or_a_layout_alike():
    expected = MeshLayout(dp_shard=2, tp=2)
    assert parse_layout("dp_shard=2, tp=2") == parse_layout({"dp_shard": 2, "tp": 2}) == parse_layout(expected)
    assert parse_layout("dp_replicate=2,dp_shard=auto") == MeshLayout(dp_replicate=2, dp_shard=-1)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("dp_shard=2,tensor=2", r"names tensor; its dimensions are pp, dp_replicate, dp_shard, tp"),
        ("tp:2", r"'tp:2' is not name=size"),
        ("tp=two", r"'two' is not a size"),
        (4, r"layout=4 is not a mesh layout"),
    ],
)
def test_a_layout_that_cannot_be_read_is_refused_naming_what_is_accepted(value, message):
    with pytest.raises((ValueError, TypeError), match=message):
        parse_layout(value)


def test_single_device_refuses_a_layout_in_the_calling_process_naming_the_sizes():
    with pytest.raises(ValueError, match=r"layout=\(pp=1, dp_replicate=1, dp_shard=1, tp=2\) cannot run under"):
        stratagem.resolve(strategy="single_device", accelerator="cpu", devices=1, layout={"dp_shard": 1, "tp": 2})
