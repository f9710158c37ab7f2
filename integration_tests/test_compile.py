"""Compiled modules under every strategy that runs here: the loss of uncompiled single_device on the same global
batch, checkpoints without ``_orig_mod`` that load into uncompiled and compiled modules alike (also to resume)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from compile_script import STEPS, CompilesBlocksItself, Net, RecordLosses, dataloader, fresh_module

from stratagem import Trainer
from stratagem.callbacks.model_checkpoint import ModelCheckpoint
from stratagem.checkpoint_io import TorchCheckpointIO
from stratagem.checkpoint_io.readers import read_full_checkpoint

SCRIPT = Path(__file__).with_name("compile_script.py")
WORKER_ENV = {"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
STRATEGIES = ["single_device", "ddp", "fsdp", "deepspeed_stage_2", "deepspeed_stage_3"]
TOLERANCE = 1e-5
"""Relative; the largest difference measured from uncompiled single_device was 2e-7 (float32 reduction order)."""


def reference(root: Path) -> dict[str, object]:
    """Uncompiled single_device in this process: the losses of 6 steps, the validation loss after them, the
    2 steps of a fit resumed from there to step 8, and the 6 steps' checkpoint with ``_orig_mod`` in its keys."""

    def trainer(max_steps: int, recorder: RecordLosses) -> Trainer:
        return Trainer(
            accelerator="cpu",
            devices=1,
            max_steps=max_steps,
            num_sanity_val_steps=0,
            logger=False,
            enable_progress_bar=False,
            callbacks=[recorder, ModelCheckpoint(dirpath=root, save_last=True)],
            seed=0,
        )

    first, resumed = RecordLosses(), RecordLosses()
    trainer(STEPS, first).fit(fresh_module(), dataloader(1))
    [metrics] = trainer(STEPS, RecordLosses()).validate(fresh_module(), dataloader(1), ckpt_path=root / "last.ckpt")
    legacy = torch.load(root / "last.ckpt", weights_only=True)
    legacy["module"] = {key.replace("blocks.", "blocks._orig_mod."): value for key, value in legacy["module"].items()}
    torch.save(legacy, root / "legacy.ckpt")
    trainer(STEPS + 2, resumed).fit(fresh_module(), dataloader(1), ckpt_path=root / "last.ckpt")
    return {
        "losses": first.losses,
        "val_loss": metrics["val_loss"],
        "resumed": resumed.losses,
        "legacy": root / "legacy.ckpt",
    }


@pytest.fixture(scope="module")
def expected(tmp_path_factory) -> dict[str, object]:
    return reference(tmp_path_factory.mktemp("reference"))


@pytest.mark.distributed
@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_compiled_module_trains_like_uncompiled_single_device_and_its_checkpoints_load_both_ways(
    strategy, expected, tmp_path
):
    root = tmp_path / strategy
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--strategy", strategy, "--root", str(root), "--legacy", str(expected["legacy"])],
        cwd=tmp_path,
        env={**os.environ, **WORKER_ENV},
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert result.returncode == 0, f"exit code {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    results = json.loads((root / "results.json").read_text())

    # Each compiled fit ran dynamo, and the user's own training_step ran on the user's module.
    assert all(count > 0 for count in results["graphs"].values()), results["graphs"]
    assert results["steps_seen"] == STEPS
    assert results["compiled"] == pytest.approx(expected["losses"], rel=TOLERANCE)
    # Compiled blocks, resumed uncompiled: the same six steps.
    assert results["blocks_half"] + results["resumed_uncompiled"] == pytest.approx(expected["losses"], rel=TOLERANCE)
    # Uncompiled checkpoint, resumed by a module that compiles its blocks in configure_model.
    assert results["resumed_compiled"] == pytest.approx(expected["resumed"], rel=TOLERANCE)
    assert results["validated_uncompiled"] == pytest.approx(expected["val_loss"], rel=TOLERANCE)
    assert results["validated_legacy"] == pytest.approx(expected["val_loss"], rel=TOLERANCE)

    uncompiled_names = set(Net().state_dict())
    for name, path in results["checkpoints"].items():
        weights = read_full_checkpoint(path, TorchCheckpointIO(), required=("module",))["module"]
        assert set(weights) == uncompiled_names, name
        Net().load_state_dict(weights)
    final = read_full_checkpoint(results["checkpoints"]["resumed_compiled"], TorchCheckpointIO())["module"]
    for loaded in (
        Net.load_from_checkpoint(results["checkpoints"]["resumed_compiled"]),
        CompilesBlocksItself.load_from_checkpoint(results["checkpoints"]["resumed_compiled"], backend="eager"),
    ):
        assert set(loaded.state_dict()) == uncompiled_names
        assert all(torch.equal(value, final[name]) for name, value in loaded.state_dict().items())
