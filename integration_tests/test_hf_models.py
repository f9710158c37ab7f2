"""Hugging Face ``transformers`` models (GPT-2, Llama, Qwen2; tiny configs, no download) under every strategy.

Each family is built in ``configure_model`` and trained on the token rule ``next = (token + 1) mod V``
(:mod:`hf_runs`) under single_device, and under ddp, fsdp (wrap and activation-checkpointing policies on
the decoder-layer class) and DeepSpeed stages 2 and 3 on 2 processes with the same global batch. Every run
must start from the eager build's weights and buffers exactly, reach single_device's loss, resume exactly
from a mid-run checkpoint, and its checkpoint must load with ``load_from_checkpoint`` and ``generate`` the rule.
One pair of worker processes serves every distributed run.
"""

from __future__ import annotations

import os

import pytest
import torch
from hf_runs import (
    FAMILIES,
    build_under_zero_3_importing_transformers_first,
    generated_continuations,
    train_resume_validate,
)

from stratagem.testing import DistributedWorkers

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]

WORKER_ENV = {
    "TORCHELASTIC_RUN_ID": "stratagem-hf-models",
    "GROUP_RANK": "0",
    "OMP_NUM_THREADS": "1",
    "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu"),
}
PARALLEL_STRATEGIES = ("ddp", "fsdp", "deepspeed_stage_2", "deepspeed_stage_3")
LOSS_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def pair():
    with DistributedWorkers(2, env=WORKER_ENV) as workers:
        yield workers


@pytest.fixture(scope="module")
def single_device_runs(tmp_path_factory):
    """single_device's run of each family, made once in this process when a test first needs it."""
    runs: dict[str, dict] = {}

    def run(family: str) -> dict:
        if family not in runs:
            runs[family] = train_resume_validate("single_device", family, 1, str(tmp_path_factory.mktemp(family)))
        return runs[family]

    return run


def _assert_starts_from_the_eager_build(per_rank: list[dict]) -> None:
    weights = per_rank[0]["weights"]
    assert weights, "no initial weights were recorded"
    assert {name: value for name, value in weights.items() if value != 0} == {}
    for rank, result in enumerate(per_rank):
        assert {name: value for name, value in result["buffers"].items() if value != 0} == {}, f"rank {rank}"


def _assert_generates_the_rule(checkpoint: str) -> None:
    generated, expected = generated_continuations(checkpoint)
    assert torch.equal(generated, expected), f"generated\n{generated}\nexpected\n{expected}"


@pytest.mark.parametrize("family", FAMILIES)
def test_single_device_starts_from_the_eager_build_resumes_exactly_and_generates_the_rule(single_device_runs, family):
    result = single_device_runs(family)
    _assert_starts_from_the_eager_build([result])
    assert result["resumed_global_step"] == 20
    assert result["resumed_val_loss"] == result["val_loss"]
    _assert_generates_the_rule(result["checkpoint"])


@pytest.mark.parametrize("strategy", PARALLEL_STRATEGIES)
@pytest.mark.parametrize("family", FAMILIES)
def test_two_ranks_start_from_the_eager_build_match_single_device_resume_exactly_and_generate_the_rule(
    pair, single_device_runs, tmp_path, family, strategy
):
    per_rank = pair.run(train_resume_validate, strategy, family, 2, str(tmp_path), timeout=240)
    result = per_rank[0]
    _assert_starts_from_the_eager_build(per_rank)
    assert result["val_loss"] == pytest.approx(single_device_runs(family)["val_loss"], abs=LOSS_TOLERANCE)
    assert result["resumed_global_step"] == 20
    assert result["resumed_val_loss"] == result["val_loss"]
    _assert_generates_the_rule(result["checkpoint"])


def test_zero_3_builds_a_model_whose_transformers_import_happens_inside_its_init_context():
    with DistributedWorkers(1, env=WORKER_ENV) as single:
        [(loaded_before, elements)] = single.run(build_under_zero_3_importing_transformers_first, timeout=240)
    assert not loaded_before, "the import must happen inside the context for this test to mean anything"
    assert elements > 0
