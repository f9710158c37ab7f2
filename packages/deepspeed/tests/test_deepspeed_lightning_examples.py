"""The DeepSpeed examples of Lightning's "train 1 trillion+ parameter models" page, as a Lightning user
writes them, run by the Trainer on two real processes (see ``lightning_examples_script.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from deepspeed_testing import WORKER_ENV

from stratagem import Trainer
from stratagem_deepspeed import DeepSpeedStrategy

SCRIPT = Path(__file__).with_name("lightning_examples_script.py")


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("lightning_examples")
    environment = {**os.environ, **WORKER_ENV}
    environment.pop("STRATAGEM_DEEPSPEED_CONFIG_PATH", None)
    environment.pop("PL_DEEPSPEED_CONFIG_PATH", None)
    try:
        done = subprocess.run(
            [sys.executable, str(SCRIPT), str(root)], env=environment, capture_output=True, text=True, timeout=540
        )
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"timed out after {error.timeout} s")
    assert done.returncode == 0, f"exit code {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
    return json.loads((root / "results.json").read_text())


@pytest.mark.distributed
@pytest.mark.timeout(600)
class TestThePagesExamples:
    def test_the_custom_config_trains_with_its_optimizer_and_warmup_scheduler(self, results):
        page = results["page_dict"]
        assert page["global_step"] == 3
        assert page["weights_moved"]
        # WarmupLR raises the rate from warmup_min_lr=0 towards warmup_max_lr on each engine step.
        rates = page["learning_rates"]
        assert rates[0] == 0.0
        assert rates == sorted(rates)
        assert 0 < rates[1] < rates[-1] < 3e-5

    def test_a_json_config_path_supplies_the_optimizer_when_configure_optimizers_returns_none(self, results):
        assert results["json_path"]["optimizer"] == "SGD"
        assert results["json_path"]["weights_moved"]

    def test_pl_deepspeed_config_path_is_read_and_configure_optimizers_may_return_empty_lists(self, results):
        assert results["environment"]["optimizer"] == "SGD"
        assert results["environment"]["global_step"] == 3

    def test_partition_activations_is_applied_to_deepspeed_checkpointing(self, results):
        assert results["partition_activations"] == [True, True, True]

    def test_fit_then_test_validate_predict_on_the_same_module_under_stage_3(self, results):
        sequence = results["sequence"]
        [tested] = sequence["test"]
        [validated] = sequence["validate"]
        assert tested["test_loss"] == pytest.approx(validated["val_loss"])
        assert sequence["predictions"] > 0
        # The caller's module holds whole tensors again, not stage 3's empty partitions.
        assert sequence["shapes"]["net.0.weight"] == [8, 32]

    def test_the_stage_3_checkpoint_directory_loads_with_load_from_checkpoint(self, results):
        assert results["load_from_checkpoint"] is True


PAGE_ONE_BIT_CONFIG = {
    "zero_allow_untested_optimizer": True,
    "optimizer": {
        "type": "OneBitAdam",
        "params": {"lr": 3e-5, "betas": [0.998, 0.999], "eps": 1e-5, "weight_decay": 1e-9, "cuda_aware": True},
    },
    "scheduler": {
        "type": "WarmupLR",
        "params": {"last_batch_iteration": -1, "warmup_min_lr": 0, "warmup_max_lr": 3e-5, "warmup_num_steps": 100},
    },
    "zero_optimization": {"stage": 2, "offload_optimizer": True},
}


def test_the_pages_onebitadam_is_refused_before_launch_naming_adam_instead(monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    with pytest.raises(ValueError, match=r"'OneBitAdam'.*'Adam' or 'AdamW'"):
        Trainer(accelerator="cpu", devices=2, strategy=DeepSpeedStrategy(config=PAGE_ONE_BIT_CONFIG))


def test_contiguous_memory_optimization_without_partition_activations_is_refused_before_launch(monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    strategy = DeepSpeedStrategy(
        config={"activation_checkpointing": {"contiguous_memory_optimization": True}, "zero_optimization": {}}
    )
    with pytest.raises(ValueError, match="partition_activations"):
        Trainer(accelerator="cpu", devices=2, strategy=strategy)
