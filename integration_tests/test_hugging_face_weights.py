"""Hugging Face weights in and out of sharded runs: a tiny GPT-2 started from ``save_pretrained`` safetensors
(``Module.load_pretrained``, each rank reading only what it holds) trains as the same model built eagerly with
``from_pretrained``; its checkpoint, exported with ``stratagem consolidate --format safetensors``, loads with
``from_pretrained`` and gives the trained module's logits."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hf_export_script import TinyGPT2, gpt2_config, probe_tokens
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM, GPT2LMHeadModel

from stratagem import Trainer
from stratagem.cli.main import main

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(240)]

SCRIPT = Path(__file__).with_name("hf_export_script.py")


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    """Weights as transformers saves them, split over several files with an index."""
    directory = tmp_path_factory.mktemp("pretrained")
    torch.manual_seed(5)
    GPT2LMHeadModel(gpt2_config()).save_pretrained(directory, max_shard_size="40KB")
    assert (directory / "model.safetensors.index.json").is_file()
    return directory


def _run_script(root: Path, strategy: str, *options: str) -> Path:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--strategy", strategy, "--root", str(root), *options],
        cwd=root.parent, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=200,
    )  # fmt: skip
    assert result.returncode == 0, f"exit code {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return root


@pytest.fixture(scope="module", params=["fsdp", "deepspeed_stage_3"])
def strategy(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def trained(strategy, pretrained, tmp_path_factory) -> Path:
    """A 4-step fit on 2 processes of the model built eagerly from the pretrained weights: its checkpoint, losses,
    trained logits and config."""
    root = tmp_path_factory.mktemp(strategy) / "run"
    return _run_script(root, strategy, "--pretrained", str(pretrained), "--build", "eager")


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


def test_a_model_built_in_configure_model_from_pretrained_shards_trains_as_the_eager_build(
    strategy, trained, pretrained, tmp_path
):
    root = _run_script(tmp_path / "run", strategy, "--pretrained", str(pretrained), "--build", "configure_model")
    for rank in (0, 1):
        losses = torch.load(root / f"losses_rank{rank}.pt")
        assert torch.equal(losses, torch.load(trained / f"losses_rank{rank}.pt")), rank
    assert torch.equal(torch.load(root / "trained_logits.pt"), torch.load(trained / "trained_logits.pt"))


def _single_device_losses(module: TinyGPT2) -> torch.Tensor:
    tokens = torch.randint(0, gpt2_config().vocab_size, (16, 12), generator=torch.Generator().manual_seed(0))
    trainer = Trainer(
        strategy="single_device", accelerator="cpu", devices=1, max_steps=3, logger=False,
        enable_progress_bar=False, enable_checkpointing=False, num_sanity_val_steps=0, seed=0,
    )  # fmt: skip
    trainer.fit(module, DataLoader(list(tokens), batch_size=4))
    return torch.stack(module.losses)


def test_under_single_device_load_pretrained_is_a_plain_load(pretrained):
    eager = _single_device_losses(TinyGPT2(pretrained, "eager"))
    assert torch.equal(_single_device_losses(TinyGPT2(pretrained, "configure_model")), eager)


def test_weights_that_do_not_fit_the_model_are_named_before_training(pretrained, tmp_path):
    smaller = tmp_path / "smaller"
    config = gpt2_config()
    config.n_layer = 1
    GPT2LMHeadModel(config).save_pretrained(smaller)
    with pytest.raises(ValueError, match=r"missing from the files: transformer\.h\.1\.ln_1\.weight"):
        _single_device_losses(TinyGPT2(smaller, "configure_model"))
    with pytest.raises(ValueError, match=r"no model\.safetensors or model\.safetensors\.index\.json there"):
        TinyGPT2(None, "eager").load_pretrained(tmp_path)


def test_load_from_checkpoint_keeps_the_checkpoints_weights_in_a_later_run(pretrained, tmp_path):
    trained = TinyGPT2(pretrained, "configure_model")
    _single_device_losses(trained)
    trained.trainer.save_checkpoint(tmp_path / "trained.ckpt")
    expected = {key: value.clone() for key, value in trained.state_dict().items()}
    # configure_model asks for the pretrained weights again; the checkpoint's are loaded after and must stay.
    module = TinyGPT2.load_from_checkpoint(tmp_path / "trained.ckpt", pretrained=pretrained, build="configure_model")
    trainer = Trainer(strategy="single_device", accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    trainer.validate(module, DataLoader(list(probe_tokens()), batch_size=3))
    for key, value in expected.items():
        assert torch.equal(module.state_dict()[key], value), key
