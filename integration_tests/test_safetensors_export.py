"""A checkpoint of a Hugging Face model trained under a sharding strategy, exported with ``stratagem consolidate
--format safetensors``, loads with ``transformers``' ``from_pretrained`` and gives the trained module's logits."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hf_export_script import probe_tokens
from transformers import AutoModelForCausalLM

from stratagem.cli.main import main

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(240)]

SCRIPT = Path(__file__).with_name("hf_export_script.py")


@pytest.fixture(scope="module", params=["fsdp", "deepspeed_stage_3"])
def trained(request, tmp_path_factory) -> Path:
    """The run directory of a 4-step fit on 2 processes: its checkpoint, the trained logits, the model's config."""
    root = tmp_path_factory.mktemp(request.param) / "run"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--strategy", request.param, "--root", str(root)],
        cwd=root.parent, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=200,
    )  # fmt: skip
    assert result.returncode == 0, f"exit code {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return root


def _exported(trained: Path, destination: Path, *options: str) -> Path:
    command = ["consolidate", str(trained / "trained.ckpt"), str(destination), "--format", "safetensors", *options]
    assert main(command) == 0
    shutil.copy(trained / "config.json", destination)
    return destination


def _logits_of(directory: Path) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(directory).eval()
    with torch.no_grad():
        return model(probe_tokens()).logits


def test_exported_weights_load_with_from_pretrained_and_give_the_trained_logits(trained, tmp_path):
    directory = _exported(trained, tmp_path / "hf")
    assert sorted(path.name for path in directory.iterdir()) == ["config.json", "model.safetensors"]
    torch.testing.assert_close(_logits_of(directory), torch.load(trained / "trained_logits.pt"), rtol=0, atol=1e-6)


def test_a_sharded_export_loads_through_its_index_to_the_same_logits(trained, tmp_path):
    directory = _exported(trained, tmp_path / "hf", "--max-shard-size", "40KB")
    assert len(list(directory.glob("model-0000?-of-0000?.safetensors"))) > 1
    assert (directory / "model.safetensors.index.json").is_file()
    torch.testing.assert_close(_logits_of(directory), torch.load(trained / "trained_logits.pt"), rtol=0, atol=1e-6)
