"""strategy="auto" with a layout= takes the installed strategy that runs it (model_parallel for tp, pipeline for pp)
in the calling process, keeps the layout for the strategy planned at the first fit, and plans only strategies
that take it."""

from __future__ import annotations

import pytest
from torch import nn

import stratagem
from stratagem.planning import plan
from stratagem.planning.auto import choose_strategy
from stratagem_fsdp import ModelParallelStrategy
from stratagem_fsdp.pipeline import PipelineStrategy


class _Blocks(stratagem.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_the_trainer_with_auto_and_a_tp_layout_runs_model_parallel_and_keeps_the_layout_for_its_first_fit():
    trainer = stratagem.Trainer(layout="tp=2", accelerator="cpu", devices=2, logger=False)
    assert isinstance(trainer.strategy, ModelParallelStrategy)
    assert trainer.strategy.mesh_layout.shape == (1, 1, 1, 2)
    assert trainer._auto_request == {"layout": "tp=2", "accelerator": "cpu", "devices": 2}


def test_auto_with_a_pp_layout_resolves_the_pipeline_strategy_with_it():
    strategy = stratagem.resolve(strategy="auto", layout={"pp": 2, "dp_shard": 1}, accelerator="cpu", devices=2)
    assert isinstance(strategy, PipelineStrategy)
    assert strategy.mesh_layout.shape == (2, 1, 1, 1)


def test_an_own_loop_with_auto_and_a_dp_shard_by_tp_layout_runs_model_parallel():
    runtime = stratagem.Runtime(layout="dp_shard=1,tp=2", accelerator="cpu", devices=2)
    assert isinstance(runtime.strategy, ModelParallelStrategy)


def test_a_pipeline_built_with_its_sizes_refuses_a_layout_that_disagrees():
    with pytest.raises(ValueError, match=r"layout=\(pp=2, .*\) disagrees with the layout .*\(pp=1, .* dp_shard=2"):
        stratagem.resolve(strategy=PipelineStrategy(pp=1, dp_shard=2), layout="pp=2", accelerator="cpu", devices=2)


def test_planning_with_a_layout_leaves_out_the_strategies_that_cannot_take_it():
    result = plan(_Blocks(), ["ddp", "model_parallel"], accelerator="cpu", devices=2, layout="tp=2")
    ddp, model_parallel = result.candidates
    assert "cannot run under strategy='ddp'" in (ddp.problem or "")
    assert model_parallel.fits
    assert result.chosen is model_parallel
    options = {"accelerator": "cpu", "devices": 2, "layout": "tp=2"}
    assert choose_strategy(_Blocks(), options, "model_parallel")[0] == "model_parallel"
