"""hpu_parallel, and hpu_fsdp and hpu_deepspeed_stage_2 built on stratagem-fsdp and stratagem-deepspeed, on 2 stand-in
cards: fit / validate / test / predict as a user's script runs them, mark_step exactly where Habana documents it,
sync_dist over hccl, and a checkpoint that single_device evaluates alike."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hpu_testing import Classifier, make_loader

import stratagem

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]

JOB = Path(__file__).with_name("hpu_job.py")
FIT_BATCHES_PER_RANK = 2 * 64 // 8 // 2
"""Two epochs of 64 samples in batches of 8, split over 2 ranks."""


@pytest.fixture(scope="module", params=["hpu_parallel", "hpu_fsdp", "hpu_deepspeed_stage_2"])
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp(request.param)
    records = out / "records"
    records.mkdir()
    environment = {key: value for key, value in os.environ.items() if key not in ("LOCAL_RANK", "RANK", "MASTER_PORT")}
    environment.update(OMP_NUM_THREADS="1", HABANA_STANDIN_RECORD=str(records), DS_BUILD_OPS="0")
    completed = subprocess.run(
        [sys.executable, str(JOB), str(out), request.param],
        env=environment,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-5000:]
    return out


def _result(run: Path) -> dict:
    return json.loads((run / "result.json").read_text())


def _records(run: Path) -> list[list[dict]]:
    return [
        [json.loads(line) for line in path.read_text().splitlines()]
        for path in sorted((run / "records").glob("*.jsonl"))
    ]


def test_fit_validate_test_and_predict_run_on_two_cards(run):
    result = _result(run)
    assert result["global_step"] == FIT_BATCHES_PER_RANK
    assert result["validate"][0]["val_loss"] > 0
    assert result["test"][0]["test_loss"] > 0
    # Rank 0 predicts its half of 16 samples: one batch of 8.
    assert [len(batch) for batch in result["predictions"]] == [8]


def test_every_rank_calls_initialize_distributed_hpu_with_its_ranks_before_joining_hccl(run):
    records = _records(run)
    assert len(records) == 2
    firsts = sorted(
        (calls[0]["call"], calls[0]["arguments"]["rank"], calls[0]["arguments"]["local_rank"]) for calls in records
    )
    assert firsts == [("initialize_distributed_hpu", 0, 0), ("initialize_distributed_hpu", 1, 1)]
    assert all(calls[0]["arguments"]["world_size"] == 2 for calls in records)


def test_mark_step_comes_after_backward_after_the_optimizer_step_and_before_evaluation_steps_only(run):
    # Per rank: 2 batches of validation after each of the 2 epochs, then 2 validated, 2 tested, 1 predicted.
    for calls in _records(run):
        places = collections.Counter(call["place"] for call in calls if call["call"] == "mark_step")
        # The three metrics logged per training step and two per validation step add none.
        assert places == {
            "fit_loop.py:forward_backward": FIT_BATCHES_PER_RANK,
            "fit_loop.py:step_optimizers": FIT_BATCHES_PER_RANK,
            "evaluation_loop.py:run_evaluation": 2 * 2 + 2 + 2,
            "predict_loop.py:run_prediction": 1,
        }


def test_sync_dist_means_over_hccl_are_the_mean_of_the_ranks(run):
    result = _result(run)
    assert result["fit"]["rank"] == pytest.approx(0.5)
    assert result["validate"][0]["val_rank"] == pytest.approx(0.5)


def test_integer_tensors_and_means_reduce_over_hccl_as_sums_of_floats(run):
    reductions = _result(run)["reductions"]
    assert reductions["int_mean"] == {"value": [1.5, 15.0], "dtype": "torch.float32"}
    assert reductions["int_sum"] == {"value": [3, 30], "dtype": "torch.int64"}
    assert reductions["int_max"] == {"value": [2, 20], "dtype": "torch.int64"}
    assert reductions["float_mean"] == {"value": 2.0, "dtype": "torch.float32"}
    assert reductions["float_sum"] == {"value": 4.0, "dtype": "torch.float32"}


def test_a_checkpoint_from_hpu_parallel_validates_under_single_device_with_the_same_loss(run, tmp_path):
    trainer = stratagem.Trainer(
        accelerator="cpu",
        devices=1,
        strategy="single_device",
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
    )
    metrics = trainer.validate(Classifier(), make_loader(num_samples=32), ckpt_path=str(run / "after_fit.ckpt"))
    assert metrics[0]["val_loss"] == pytest.approx(_result(run)["validate"][0]["val_loss"], abs=1e-6)
