"""``stratagem plan --world-size`` for pipeline layouts, checked against the dry run: the pipeline strategy's cut
(and ``fully_shard`` of each stage) on torch's fake process group, one process playing ranks of a 1,024-rank job."""

import pytest

from stratagem import registry
from stratagem.demo.llama import LlamaModule
from stratagem.planning.cluster import ClusterTarget, plan_cluster
from stratagem.planning.devices import device_spec
from stratagem.planning.rehearsal import rehearse, sample_ranks

WORLD, PER_NODE = 1024, 8
# Four blocks (two a stage at pp=2) and untied embeddings as large as the head: the stages hold halves of the model
# to within the final norm, which is what the plan counts.
MODULE_ARGS = {"dim": 256, "layers": 4, "vocab": 1024, "ffn_dim": 512}


def _layout(**sizes: int) -> dict[str, int]:
    return {"pp": 1, "dp_replicate": 1, "dp_shard": 1, "tp": 1, **sizes}


@pytest.mark.timeout(120)
def test_plan_and_dry_run_agree_on_model_state_per_rank_for_pipeline_layouts():
    module = LlamaModule("tiny", **MODULE_ARGS)
    strategy = registry.strategies.create("pipeline")
    plan = plan_cluster(
        module,
        {"pipeline": strategy},
        ClusterTarget(WORLD, PER_NODE, device_spec("h100-80gb")),
        batch_size=2,
        seq_len=16,
    )
    for layout in (_layout(pp=2, dp_replicate=512), _layout(pp=2, dp_replicate=256, dp_shard=2)):
        planned = next(c for c in plan.candidates if "pipeline" in c.strategies and c.layout == layout)
        ranks = sample_ranks(layout, all_ranks=True)
        rehearsal = rehearse(module, "pipeline", strategy, layout, ranks)
        assert rehearsal.not_rehearsed is None
        assert rehearsal.problems == [], layout
        played = [rank.rank for rank in rehearsal.ranks]
        assert played == ranks
        # Ranks of both stages are played: the first half of the ranks is stage 0, the second half stage 1.
        assert {rank.coordinates["pp"] for rank in rehearsal.ranks} == {0, 1}
        for rank in rehearsal.ranks:
            for part, planned_bytes in (
                ("parameter_bytes", planned.memory.parameters),
                ("gradient_bytes", planned.memory.gradients),
                ("optimizer_state_bytes", planned.memory.optimizer_state),
            ):
                assert getattr(rank, part) == pytest.approx(planned_bytes, rel=0.01), (layout, rank.rank, part)
            # Each rank holds its own stage's end of the model, sharded over dp_shard.
            name, whole, local = rank.largest_shard or ("", (), ())
            assert name == ("model.tok_embeddings.weight" if rank.coordinates["pp"] == 0 else "model.output.weight")
            assert local == (whole[0] // layout["dp_shard"], whole[1])
        assert rehearsal.peak_rss_bytes < 2 * 1024**3


@pytest.mark.timeout(60)
def test_dry_run_names_the_pipeline_cuts_the_real_run_would_refuse():
    module = LlamaModule("tiny", **MODULE_ARGS)
    deep = rehearse(module, "pipeline", registry.strategies.create("pipeline"), _layout(pp=8, dp_replicate=2), [0])
    assert (
        deep.ranks[0]
        .problems[0]
        .startswith(
            "PipelineStrategy setup failed (pp=8 dp_replicate=2): ValueError: The pipeline has 8 stages but "
            "'model.layers' holds 4 block(s)"
        )
    )
    beyond = registry.strategies.create("pipeline", pipeline_split=["model.layers.6"])
    past_the_end = rehearse(module, "pipeline", beyond, _layout(pp=2), [0])
    assert "model.layers.6" in past_the_end.ranks[0].problems[0]


@pytest.mark.timeout(120)
def test_plan_counts_no_pipeline_layout_with_more_stages_than_blocks_as_fitting():
    module = LlamaModule("tiny", **MODULE_ARGS)
    plan = plan_cluster(
        module,
        {"pipeline": registry.strategies.create("pipeline")},
        ClusterTarget(64, PER_NODE, device_spec("h100-80gb")),
        batch_size=2,
        seq_len=16,
    )
    deep = [c for c in plan.candidates if c.layout["pp"] > MODULE_ARGS["layers"]]
    shallow = [c for c in plan.candidates if 1 < c.layout["pp"] <= MODULE_ARGS["layers"]]
    assert deep
    assert shallow
    assert all(c.problem == f"{c.layout['pp']} pipeline stages, but the module has 4 blocks to cut" for c in deep)
    assert all(c.fits for c in shallow)
    # Its default takes every rank as a stage (pp=64): auto's choice must come from a layout the model can hold.
    assert plan.auto_choice is None or plan.auto_choice.layout["pp"] <= MODULE_ARGS["layers"]
