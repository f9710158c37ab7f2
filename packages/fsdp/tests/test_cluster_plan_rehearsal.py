"""``stratagem plan --world-size`` for fsdp and model_parallel, checked against ``--dry-run``: the strategies' real
setup on torch's fake process group, one process playing the ranks of a 16-rank job."""

import json

import pytest
from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

from stratagem import registry
from stratagem.cli.main import main
from stratagem.demo.llama import Llama, LlamaModule, tensor_parallel_plan
from stratagem.planning.cluster import ClusterTarget, plan_cluster
from stratagem.planning.devices import device_spec
from stratagem.planning.rehearsal import rehearse, sample_ranks
from stratagem.planning.workload import micro_batch_input

WORLD, PER_NODE = 16, 8
TARGET = ClusterTarget(WORLD, PER_NODE, device_spec("h100-80gb"))


class MisnamedPlan(LlamaModule):
    """Names a projection the blocks do not have, as a TP plan copied from another model would."""

    def configure_model(self) -> None:
        if self.model is not None:
            return
        self.model = Llama(self.config)
        mesh = self.device_mesh
        if mesh is not None and mesh["tp"].size() > 1:
            tensor_parallel_plan(self.model, mesh["tp"])
            for layer in self.model.layers:
                parallelize_module(layer, mesh["tp"], {"attention.wqkv": ColwiseParallel()})


def _plan(module, names):
    strategies = {name: registry.strategies.create(name) for name in names}
    return plan_cluster(module, strategies, TARGET, batch_size=2, seq_len=16), strategies


def _candidate(plan, name, **layout):
    full = {"pp": 1, "dp_replicate": 1, "dp_shard": 1, "tp": 1, **layout}
    return next(c for c in plan.candidates if name in c.strategies and c.layout == full)


@pytest.mark.timeout(120)
def test_plan_and_dry_run_agree_on_model_state_per_rank_to_one_percent():
    module = LlamaModule("tiny")
    plan, strategies = _plan(module, ["fsdp", "model_parallel"])
    example = micro_batch_input(module, 2, 16)
    for name, layout, all_ranks in (
        ("fsdp", {"dp_shard": 16}, True),
        ("fsdp", {"dp_replicate": 2, "dp_shard": 8}, False),
        ("model_parallel", {"dp_shard": 4, "tp": 4}, True),
        ("model_parallel", {"dp_replicate": 2, "dp_shard": 2, "tp": 4}, False),
    ):
        planned = _candidate(plan, name, **layout)
        ranks = sample_ranks(planned.layout, all_ranks)
        rehearsal = rehearse(module, name, strategies[name], planned.layout, ranks, None, example)
        assert rehearsal.problems == [], (name, layout)
        assert [rank.rank for rank in rehearsal.ranks] == ranks
        assert (len(ranks) > 1) == all_ranks
        for rank in rehearsal.ranks:
            for part, planned_bytes in (
                ("parameter_bytes", planned.memory.parameters),
                ("gradient_bytes", planned.memory.gradients),
                ("optimizer_state_bytes", planned.memory.optimizer_state),
            ):
                assert getattr(rank, part) == pytest.approx(planned_bytes, rel=0.01), (name, layout, rank.rank, part)
        assert rehearsal.peak_rss_bytes < 2 * 1024**3


@pytest.mark.timeout(120)
def test_dry_run_names_the_errors_the_real_run_would_hit():
    strategy = registry.strategies.create("model_parallel")
    example = micro_batch_input(LlamaModule("tiny"), 1, 8)
    # 4 key/value heads cannot be split over 8 tensor-parallel ranks.
    layout = {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "tp": 8}
    heads = rehearse(LlamaModule("tiny"), "model_parallel", strategy, layout, [0], None, example)
    assert any(problem.startswith("forward fails once split (dp_shard=2 tp=8)") for problem in heads.problems)
    layout = {"pp": 1, "dp_replicate": 1, "dp_shard": 4, "tp": 4}
    misnamed = rehearse(MisnamedPlan("tiny"), "model_parallel", strategy, layout, [0], None, example)
    assert any(
        problem.startswith("tensor-parallel plan: Parallelize plan key 'wqkv' could not be resolved")
        for problem in misnamed.problems
    )
    ddp = rehearse(LlamaModule("tiny"), "ddp", registry.strategies.create("ddp"), {"dp_replicate": 16}, [0])
    assert ddp.ranks == []
    assert "DDPStrategy does not say how to apply its setup on the meta device" in (ddp.not_rehearsed or "")


def test_plan_ranks_layouts_says_what_fits_and_what_auto_takes():
    plan, _ = _plan(LlamaModule("tiny"), ["ddp", "fsdp", "fsdp_spawn", "model_parallel"])
    assert all(candidate.fits for candidate in plan.candidates if candidate.layout["tp"] < 8)
    # tp=8 splits the 4 key/value heads unevenly: the plan still counts it, the dry run refuses it.
    assert {candidate.name for candidate in plan.candidates} == {"ddp", "fsdp", "model_parallel"}
    assert _candidate(plan, "fsdp", dp_shard=16).strategies == ["fsdp", "fsdp_spawn"]
    hybrid = _candidate(plan, "fsdp", dp_replicate=2, dp_shard=8)
    assert hybrid.options == 'sharding_strategy="HYBRID_SHARD", device_mesh=(2, 8)'
    assert _candidate(plan, "model_parallel", dp_shard=2, tp=8).is_default
    # ddp fits and is auto's default for 16 ranks.
    auto = plan.auto_choice
    assert auto is not None
    assert auto.name == "ddp"
    assert auto.layout["dp_replicate"] == WORLD
    ranked = [candidate for candidate in plan.ranked if candidate.fits]
    per_token = [candidate.step.total / candidate.tokens_per_step for candidate in ranked]
    assert per_token == sorted(per_token)
    # Sharding over 16 ranks holds a sixteenth of each part that replication holds whole.
    whole, sharded = _candidate(plan, "ddp", dp_replicate=16), _candidate(plan, "fsdp", dp_shard=16)
    assert sharded.memory.optimizer_state == pytest.approx(whole.memory.optimizer_state / 16, rel=1e-6)


def test_a_strategy_whose_default_layout_cannot_fill_the_world_is_said_so():
    strategies = {"model_parallel": registry.strategies.create("model_parallel", tp=3)}
    plan = plan_cluster(LlamaModule("tiny"), strategies, TARGET, batch_size=1, seq_len=8)
    assert (
        "model_parallel: its default layout cannot run here (the layout dp_shard=-1 tp=3 does not fill 16 ranks)"
        in plan.notes[-1]
    )
    assert plan.candidates
    assert not any(candidate.is_default for candidate in plan.candidates)
    assert plan.auto_choice is None


@pytest.mark.timeout(120)
def test_plan_command_for_a_cluster_keeps_to_100_columns_and_json_keeps_every_layout(capsys):
    argv = [
        "plan", "stratagem.demo.llama:LlamaModule", "--world-size", str(WORLD), "--device", "a100-80gb",
        "--seq-len", "16", "--batch-size", "2", "--strategies", "ddp,fsdp,model_parallel", "--rows", "6",
        "--auto-wrap", "blocks", "--activation-checkpointing", "blocks",
    ]  # fmt: skip
    assert main([*argv, "--dry-run"]) == 0
    output = capsys.readouterr().out
    assert max(len(line) for line in output.splitlines()) <= 100
    assert "target: 16 x a100-80gb (2 node(s) of 8)" in output
    assert "strategy='auto' would choose ddp (R16, its default layout)" in output
    assert "- ddp R16: not rehearsed: DDPStrategy does not say how" in output
    # model_parallel's default layout (tp = the 8 devices of a node) splits 4 key/value heads 8 ways.
    assert "problem: forward fails once split (dp_shard=2 tp=8)" in output
    assert "(plan " in output
    assert "+0.0%)" in output
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    # ddp: R16; fsdp: R x S = 16 (5 ways); model_parallel: R x S x T with T dividing 8 (5 + 4 + 3 + 2 ways).
    assert len(data["candidates"]) == 1 + 5 + 14
    assert data["auto"] == {"strategy": "ddp", "layout": {"pp": 1, "dp_replicate": 16, "dp_shard": 1, "tp": 1}}
    assert {"compute", "data_parallel", "tensor_parallel", "total"} <= set(data["candidates"][0]["step_seconds"])
