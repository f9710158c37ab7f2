"""The Trainer on DeepSpeed, as a user runs it: scripts and the ``stratagem`` command started as
real processes (the launcher re-runs them for rank 1), then their checkpoints moved around; and
Trainers run inside a process group the user created (a pool of workers, as in a script that
initialises torch.distributed itself)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from deepspeed_testing import WORKER_ENV, worker_pool

from stratagem import Trainer
from stratagem.demo import DemoModule, demo_dataloaders

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]

SCRIPT = Path(__file__).with_name("deepspeed_trainer_script.py")
STAGE_3_STEPS = 12


def run(*arguments: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    try:
        result = subprocess.run(
            arguments, cwd=cwd, env={**os.environ, **WORKER_ENV}, capture_output=True, text=True, timeout=240
        )
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"timed out after {error.timeout} s\n{_tail(error.stdout)}\n{_tail(error.stderr)}")
    assert result.returncode == 0, f"exit code {result.returncode}\n{_tail(result.stdout)}\n{_tail(result.stderr)}"
    return result


def _tail(output: str | bytes | None) -> str:
    text = output.decode(errors="replace") if isinstance(output, bytes) else output or ""
    return text[-6000:]


def run_script(root: Path, *arguments: str) -> Path:
    run(sys.executable, str(SCRIPT), "--root", str(root), *arguments, cwd=root.parent)
    return root


def only_checkpoint(root: Path) -> Path:
    """The one checkpoint of the one run under ``root``."""
    [checkpoint] = (root / "checkpoints" / "version_0").iterdir()
    return checkpoint


@pytest.fixture(scope="module")
def stage_3_run(tmp_path_factory) -> Path:
    """A fit of 12 steps on 2 processes with deepspeed_stage_3: its checkpoint and live weights, a checkpoint
    saved from on_train_end, and one trainer.save_checkpoint wrote once fit had returned."""
    return run_script(
        tmp_path_factory.mktemp("stage_3") / "run",
        "--max-steps", str(STAGE_3_STEPS), "--save-at-train-end", "--save-after-fit",
    )  # fmt: skip


def live_weights(root: Path) -> dict[str, torch.Tensor]:
    return torch.load(root / "live_weights.pt", weights_only=True)


def assert_identical(weights: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert set(weights) == set(expected)
    for name, value in expected.items():
        assert torch.equal(weights[name], value), name


def test_stratagem_demo_trains_deepspeed_stage_3_in_bf16_on_two_cpu_processes(tmp_path):
    stratagem = Path(sys.executable).with_name("stratagem")
    result = run(
        str(stratagem), "demo", "--strategy", "deepspeed_stage_3", "--devices", "2", "--precision", "bf16-mixed",
        "--max-steps", "20", "--root-dir", str(tmp_path / "demo"), "--logger", "none",
        cwd=tmp_path,
    )  # fmt: skip
    assert "done after 20 steps" in result.stdout
    checkpoint = only_checkpoint(tmp_path / "demo")
    assert (checkpoint / "latest").read_text() == "global_step20"


def test_the_stage_3_checkpoint_is_a_deepspeed_directory_with_the_loop_state(stage_3_run):
    checkpoint = only_checkpoint(stage_3_run)
    assert checkpoint.name == f"epoch=0-step={STAGE_3_STEPS}.ckpt"
    assert sorted(path.name for path in checkpoint.iterdir()) == [
        f"global_step{STAGE_3_STEPS}", "latest", "stratagem_state.pt", "zero_to_fp32.py", "zero_to_torch.py",
    ]  # fmt: skip
    shards = sorted(path.name for path in (checkpoint / f"global_step{STAGE_3_STEPS}").iterdir())
    assert shards == [
        "zero_pp_rank_0_mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "zero_pp_rank_1_mp_rank_00_model_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt",
    ]  # fmt: skip
    assert not [path for path in checkpoint.parent.iterdir() if path.name.startswith(".")], "no temporary left"


@pytest.fixture(scope="module")
def interrupted_checkpoint(tmp_path_factory) -> Path:
    """The checkpoint of a stage-3 fit stopped after half its steps (copied out of its run's directory)."""
    root = run_script(tmp_path_factory.mktemp("interrupted") / "run", "--stop-after", str(STAGE_3_STEPS // 2))
    return only_checkpoint(root).rename(root.parent / "half.ckpt")


def test_a_fit_stopped_and_resumed_from_its_checkpoint_ends_with_bitwise_the_same_weights(
    stage_3_run, interrupted_checkpoint, tmp_path
):
    resumed = run_script(tmp_path / "resumed", "--ckpt-path", str(interrupted_checkpoint))
    assert_identical(live_weights(resumed), live_weights(stage_3_run))


def test_one_script_fits_then_validates_and_resumes_its_checkpoint_with_new_trainers_in_the_same_processes(
    stage_3_run, tmp_path
):
    # Each run tears down its process group; the next one's engine must not reuse DeepSpeed's groups of the last.
    root = run_script(
        tmp_path / "sequence", "--stop-after", str(STAGE_3_STEPS // 2), "--then", "validate", "resume",
    )  # fmt: skip
    assert_identical(torch.load(root / "live_weights_after_validate.pt", weights_only=True), live_weights(root))
    assert json.loads((root / "results.json").read_text())[0].keys() == {"val_loss", "val_acc"}
    resumed = torch.load(root / "live_weights_after_resume.pt", weights_only=True)
    assert_identical(resumed, live_weights(stage_3_run))


def test_a_stage_3_checkpoint_resumes_under_ddp_with_its_optimizer_state(stage_3_run, interrupted_checkpoint, tmp_path):
    resumed = run_script(tmp_path / "ddp", "--strategy", "ddp", "--ckpt-path", str(interrupted_checkpoint))
    expected = live_weights(stage_3_run)
    for name, value in live_weights(resumed).items():
        # DDP averages gradients in another order than ZeRO's reduce-scatter: equal up to rounding.
        torch.testing.assert_close(value, expected[name], atol=1e-5, rtol=0, msg=name)


def test_the_stage_3_checkpoint_evaluates_under_single_device_with_identical_weights(stage_3_run):
    trainer = Trainer(strategy="single_device", accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    module = DemoModule(hidden=32)
    _, val_loader = demo_dataloaders(batch_size=16, num_samples=512)
    [metrics] = trainer.validate(module, val_loader, ckpt_path=only_checkpoint(stage_3_run))
    assert_identical(module.state_dict(), live_weights(stage_3_run))
    assert set(metrics) == {"val_loss", "val_acc"}


def test_save_checkpoint_after_fit_returned_writes_the_trained_weights_that_validate_under_single_device(
    stage_3_run,
):
    assert not list(stage_3_run.glob("after_fit_rank*.error"))
    _, val_loader = demo_dataloaders(batch_size=16, num_samples=512)
    module = DemoModule(hidden=32)
    [metrics] = _single_device_trainer().validate(module, val_loader, ckpt_path=stage_3_run / "after_fit.ckpt")
    assert_identical(module.state_dict(), live_weights(stage_3_run))
    [at_train_end] = _single_device_trainer().validate(
        DemoModule(hidden=32), val_loader, ckpt_path=stage_3_run / "train_end.ckpt"
    )
    assert metrics["val_loss"] == at_train_end["val_loss"]


def test_a_checkpoint_saved_at_train_end_gives_the_same_loss_under_single_device(stage_3_run):
    _, val_loader = demo_dataloaders(batch_size=16, num_samples=512)
    trained = DemoModule(hidden=32)
    trained.configure_model()
    trained.load_state_dict(live_weights(stage_3_run))
    [expected] = _single_device_trainer().validate(trained, val_loader)
    module = DemoModule(hidden=32)
    [metrics] = _single_device_trainer().validate(module, val_loader, ckpt_path=stage_3_run / "train_end.ckpt")
    assert_identical(module.state_dict(), live_weights(stage_3_run))
    assert metrics["val_loss"] == expected["val_loss"]


def _single_device_trainer() -> Trainer:
    return Trainer(strategy="single_device", accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)


@pytest.mark.parametrize(
    ("strategy", "devices"),
    [("ddp", 2), ("fsdp", 2), ("deepspeed_stage_2", 1)],
    ids=["ddp-on-2-processes", "fsdp-on-2-processes", "deepspeed-stage-2-on-1-process"],
)
def test_the_stage_3_checkpoint_loads_with_identical_weights_into(stage_3_run, tmp_path, strategy, devices):
    root = run_script(
        tmp_path / strategy, "--strategy", strategy, "--devices", str(devices),
        "--validate", "--ckpt-path", str(only_checkpoint(stage_3_run)),
    )  # fmt: skip
    assert_identical(live_weights(root), live_weights(stage_3_run))
    assert json.loads((root / "results.json").read_text())[0].keys() == {"val_loss", "val_acc"}


def test_stratagem_consolidate_writes_one_file_that_plain_torch_load_reads(stage_3_run, tmp_path):
    stratagem = Path(sys.executable).with_name("stratagem")
    destination = tmp_path / "full.pt"
    run(str(stratagem), "consolidate", str(only_checkpoint(stage_3_run)), str(destination), cwd=tmp_path)
    checkpoint = torch.load(destination, weights_only=True)
    assert_identical(checkpoint["module"], live_weights(stage_3_run))
    assert checkpoint["loops"]["fit"]["global_step"] == STAGE_3_STEPS


@pytest.fixture(scope="module")
def workers():
    with worker_pool() as pool:
        yield pool


def _fit_then_validate_in_the_pools_group(alias: str, root: str) -> tuple[list[str], bool, float]:
    group = dist.group.WORLD
    options = dict(
        strategy=alias, accelerator="cpu", devices=2, default_root_dir=root, logger=False, enable_progress_bar=False,
        num_sanity_val_steps=0,
    )  # fmt: skip
    train_loader, val_loader = demo_dataloaders(batch_size=8, num_samples=64)
    fitting = Trainer(max_steps=2, **options)
    fitting.fit(DemoModule(hidden=8), train_loader)
    assert fitting.checkpoint_callback is not None
    [metrics] = Trainer(**options).validate(
        DemoModule(hidden=8), val_loader, ckpt_path=fitting.checkpoint_callback.best_model_path
    )
    ranks = torch.ones(1)
    dist.all_reduce(ranks)
    return sorted(metrics), dist.group.WORLD is group, ranks.item()


@pytest.mark.parametrize("alias", ["deepspeed_stage_2", "deepspeed_stage_3"])
def test_trainers_one_after_another_in_a_process_group_the_user_created_leave_it_working(workers, tmp_path, alias):
    expected = (["val_acc", "val_loss"], True, 2.0)
    assert workers.run(_fit_then_validate_in_the_pools_group, alias, str(tmp_path)) == [expected, expected]
