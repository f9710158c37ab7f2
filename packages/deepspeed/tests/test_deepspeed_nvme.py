"""NVMe offload: parameters and optimizer state swapped to files through DeepSpeed's async_io op.

The op links against libaio (Debian: libaio-dev), and its first build takes minutes: this is
the one module that compiles it. Without libaio the strategy refuses before launch, naming it.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from deepspeed_testing import STEPS_NVME, WORKER_ENV, reference_run, set_up, train_steps
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import stratagem
from stratagem import Trainer, registry
from stratagem.callbacks import ModelCheckpoint
from stratagem.checkpoint_io import TorchCheckpointIO, read_full_checkpoint
from stratagem.strategies import LoopSettings
from stratagem.testing import DistributedWorkers

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(900)]


def _train_offloaded_to_nvme(nvme_path: str) -> tuple[list[float], dict[str, torch.Tensor], list[str]]:
    strategy = registry.strategies.create("deepspeed_stage_3_offload_nvme", nvme_path=nvme_path)
    strategy = stratagem.resolve(strategy=strategy, accelerator="cpu", devices=2)
    strategy.connect_loop_settings(LoopSettings())
    strategy.setup_environment()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, optimizers = set_up(strategy)
    losses = train_steps(strategy, model, optimizers, STEPS_NVME)
    # DeepSpeed makes one swap folder per rank for parameters and for optimizer state (files appear
    # in them once tensors outgrow the CPU buffers, which this small model does not).
    swap_folders = sorted(str(path.relative_to(nvme_path)) for path in Path(nvme_path).glob("zero_stage_3/*/rank*"))
    return losses, strategy.module_full_state_dict(), swap_folders


def test_stage_3_offloaded_to_nvme_trains_like_one_process(tmp_path):
    with DistributedWorkers(2, env=WORKER_ENV) as workers:
        losses, weights, swap_folders = workers.run(_train_offloaded_to_nvme, str(tmp_path), timeout=840)[0]
    assert swap_folders == [
        "zero_stage_3/float32params/rank0", "zero_stage_3/float32params/rank1",
        "zero_stage_3/optimizer/rank0", "zero_stage_3/optimizer/rank1",
    ]  # fmt: skip
    reference_losses, reference_weights = reference_run(STEPS_NVME)
    assert losses == pytest.approx(reference_losses, abs=1e-5)
    for name, value in reference_weights.items():
        torch.testing.assert_close(weights[name], value, atol=1e-5, rtol=0, msg=name)


def test_without_a_usable_libaio_nvme_offload_is_refused_before_launch_naming_libaio_dev(monkeypatch, tmp_path):
    # DeepSpeed checks libaio by compiling and linking a call to io_submit; a compiler that fails
    # every build is what that check meets on a machine without libaio-dev.
    monkeypatch.setenv("CC", "false")
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    strategy = registry.strategies.create("deepspeed_stage_3_offload_nvme", nvme_path=str(tmp_path))
    with pytest.raises(RuntimeError, match=r"libaio.*apt-get install libaio-dev"):
        stratagem.resolve(strategy=strategy, accelerator="cpu", devices=2)


# -- one module through every loop, on the Trainer -------------------------------------------------------------

SEQUENCE_STEPS = 3
SAMPLES = 64
BATCH_SIZE = 8
"""Per process; a single process takes batches of 2 * BATCH_SIZE to see the same global batches."""


class IndexedRegressionModule(stratagem.Module):
    """Predicts each sample's outputs beside its index, so that the two ranks' shares can be put back in order."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.layers(features)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        features, targets, _ = batch
        return nn.functional.mse_loss(self(features), targets)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        features, targets, _ = batch
        self.log("val_loss", nn.functional.mse_loss(self(features), targets), sync_dist=True)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        features, targets, _ = batch
        self.log("test_loss", nn.functional.mse_loss(self(features), targets), sync_dist=True)

    def predict_step(self, batch: Any, batch_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        features, _, index = batch
        return index, self(features)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def indexed_loader(seed: int, batch_size: int = BATCH_SIZE) -> DataLoader:
    generator = torch.Generator().manual_seed(seed)
    features, targets = torch.randn(SAMPLES, 8, generator=generator), torch.randn(SAMPLES, 2, generator=generator)
    return DataLoader(TensorDataset(features, targets, torch.arange(SAMPLES)), batch_size=batch_size)


def _trainer(strategy: Any, devices: int, root: Path, **options: Any) -> Trainer:
    return Trainer(
        strategy=strategy, accelerator="cpu", devices=devices, default_root_dir=root, logger=False,
        enable_progress_bar=False, num_sanity_val_steps=0, seed=0, **options,
    )  # fmt: skip


def _ordered(predictions: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    index = torch.cat([batch_index for batch_index, _ in predictions])
    outputs = torch.cat([batch_outputs for _, batch_outputs in predictions])
    return outputs[index.argsort()]


def _fit_evaluate_predict_then_fit_again(root: str) -> dict[str, Any]:
    """Under NVMe offload, one module: fit, validate, test, predict with one Trainer, save after fit has
    returned, fit again with that Trainer and then with a new one. Also checks that every NVMe parameter
    swapper made on the way has given its page-locked buffers back."""
    from deepspeed.runtime.swap_tensor.partitioned_param_swapper import AsyncPartitionedParameterSwapper

    swappers: list[Any] = []
    original_init = AsyncPartitionedParameterSwapper.__init__

    def recording_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        swappers.append(self)

    directory = Path(root)
    strategy_options = {"nvme_path": str(directory / "nvme")}
    AsyncPartitionedParameterSwapper.__init__ = recording_init
    try:
        checkpoint = ModelCheckpoint(dirpath=directory / "checkpoints", filename="final")
        trainer = _trainer(
            registry.strategies.create("deepspeed_stage_3_offload_nvme", **strategy_options), 2, directory,
            max_steps=SEQUENCE_STEPS, callbacks=[checkpoint],
        )  # fmt: skip
        module = IndexedRegressionModule()
        trainer.fit(module, indexed_loader(0))
        [validated] = trainer.validate(module, indexed_loader(1))
        [tested] = trainer.test(module, indexed_loader(2))
        predictions = trainer.predict(module, indexed_loader(3))
        try:
            trainer.save_checkpoint(directory / f"after_fit_rank{trainer.global_rank}.ckpt")
            save_error = ""
        except RuntimeError as error:
            save_error = str(error)
        after_first_fit = {name: value.clone() for name, value in module.state_dict().items()}
        trainer.fit(module, indexed_loader(0))
        again_on_same_trainer = (trainer.global_step, module.state_dict())
        second = _trainer(
            registry.strategies.create("deepspeed_stage_3_offload_nvme", **strategy_options), 2, directory / "second",
            max_steps=SEQUENCE_STEPS, enable_checkpointing=False,
        )  # fmt: skip
        second.fit(module, indexed_loader(0))
    finally:
        AsyncPartitionedParameterSwapper.__init__ = original_init
    return {
        "checkpoint": checkpoint.last_model_path or checkpoint.best_model_path,
        "losses": (float(validated["val_loss"]), float(tested["test_loss"])),
        "predictions": predictions,
        "save_error": save_error,
        "after_first_fit": after_first_fit,
        "again_on_same_trainer": again_on_same_trainer,
        "after_second_fit": (second.global_step, module.state_dict()),
        "swappers_made": len(swappers),
        "swappers_holding_buffers": sum(swapper.buffers is not None for swapper in swappers),
    }


@pytest.fixture(scope="module")
def sequence(tmp_path_factory) -> list[dict[str, Any]]:
    root = tmp_path_factory.mktemp("sequence")
    with DistributedWorkers(2, env=WORKER_ENV) as workers:
        return workers.run(_fit_evaluate_predict_then_fit_again, str(root), timeout=840)


def test_fit_validate_test_predict_on_one_module_predicts_like_single_device_from_the_checkpoint(sequence):
    checkpoint = sequence[0]["checkpoint"]
    assert checkpoint
    assert all(rank["checkpoint"] == checkpoint for rank in sequence)
    assert all(math.isfinite(loss) for rank in sequence for loss in rank["losses"])
    predicted = _ordered([batch for rank in sequence for batch in rank["predictions"]])
    reference = _trainer("single_device", 1, Path(checkpoint).parent / "reference").predict(
        IndexedRegressionModule(), indexed_loader(3), ckpt_path=checkpoint
    )
    assert predicted.shape == (SAMPLES, 2)
    torch.testing.assert_close(predicted, _ordered(reference), atol=1e-6, rtol=0)


def test_save_checkpoint_after_fit_returned_writes_rank_zero_s_whole_weights(sequence):
    assert [rank["save_error"] for rank in sequence] == ["", ""]
    written = Path(sequence[0]["checkpoint"]).parent.parent / "after_fit_rank0.ckpt"
    weights = read_full_checkpoint(written, TorchCheckpointIO())["module"]
    for name, value in sequence[0]["after_first_fit"].items():
        torch.testing.assert_close(weights[name], value, atol=0, rtol=0, msg=name)
    assert not (written.parent / "after_fit_rank1.ckpt").exists(), "only rank 0 writes after the run"


def test_a_second_fit_on_the_same_trainer_at_max_steps_keeps_the_weights(sequence):
    for rank in sequence:
        global_step, weights = rank["again_on_same_trainer"]
        assert global_step == SEQUENCE_STEPS
        for name, value in rank["after_first_fit"].items():
            torch.testing.assert_close(weights[name], value, atol=0, rtol=0, msg=name)


def test_a_second_fit_of_the_same_module_trains_on_from_its_weights_like_single_device(sequence):
    module = IndexedRegressionModule()
    module.load_state_dict(sequence[0]["after_first_fit"])
    reference = _trainer("single_device", 1, Path(sequence[0]["checkpoint"]).parent / "second-reference", max_steps=3)
    # One process sees each step's global batch: both ranks' shares of it.
    reference.fit(module, indexed_loader(0, batch_size=2 * BATCH_SIZE))
    for rank in sequence:
        global_step, weights = rank["after_second_fit"]
        assert global_step == SEQUENCE_STEPS
        for name, value in module.state_dict().items():
            torch.testing.assert_close(weights[name], value, atol=1e-5, rtol=0, msg=name)
        assert not torch.equal(weights["layers.0.weight"], rank["after_first_fit"]["layers.0.weight"])


def test_every_nvme_swapper_of_the_runs_gives_its_page_locked_buffers_back(sequence):
    for rank in sequence:
        assert rank["swappers_made"] >= 6  # at least one per run: fit, validate, test, predict, fit, fit
        assert rank["swappers_holding_buffers"] == 0


# -- optimizer sub-groups large enough to be swapped to NVMe -----------------------------------------------------

SWAPPED_SUB_GROUP_SIZE = 250_000
"""Elements of each rank's partition per optimizer sub-group: each weight of WideNet (294,912 per rank) closes one,
above DeepSpeed's smallest swappable tensor (1 MiB, 262,144 fp32 elements), so those four live in the swap files,
unlike the sub-groups of the models above. The last bias makes a fifth, too small to swap."""


class WideNet(nn.Module):
    """About 2.4 million parameters in four layers."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(768, 768), nn.Linear(768, 768), nn.Linear(768, 768), nn.Linear(768, 768))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.layers(features)


def _wide_run(nvme_path: str, name: str = "deepspeed_stage_3_offload_nvme") -> tuple[Any, nn.Module, Any]:
    options = {"nvme_path": nvme_path} if name.endswith("nvme") else {}
    strategy = registry.strategies.create(name, sub_group_size=SWAPPED_SUB_GROUP_SIZE, **options)
    strategy = stratagem.resolve(strategy=strategy, accelerator="cpu", devices=2)
    strategy.connect_loop_settings(LoopSettings())
    strategy.setup_environment()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with strategy.module_init_context():
            torch.manual_seed(0)
            model = WideNet()
        model = strategy.setup_module(model)
        [optimizer] = strategy.setup_optimizers([torch.optim.Adam(model.parameters(), lr=1e-3)])
    return strategy, model, optimizer


def _wide_step(strategy: Any, model: nn.Module, optimizer: Any, step: int) -> None:
    generator = torch.Generator().manual_seed(100 * step + strategy.global_rank)
    loss = model(torch.randn(4, 768, generator=generator)).square().mean()
    strategy.backward(loss, optimizer)
    strategy.optimizer_step(optimizer)
    strategy.zero_grad(optimizer)


def _save_with_swapped_sub_groups_then_step(root: str) -> dict[str, Any]:
    from stratagem_deepspeed.nvme_swap import swapped_optimizer_sub_groups

    strategy, model, optimizer = _wide_run(str(Path(root) / "nvme"))
    _wide_step(strategy, model, optimizer, 0)
    swapped = swapped_optimizer_sub_groups(strategy.engine.optimizer)
    strategy.save_checkpoint(Path(root) / "checkpoint", {"module": model, "optimizers": [optimizer]})
    at_save = strategy.module_full_state_dict()
    _wide_step(strategy, model, optimizer, 1)
    return {"swapped": swapped, "at_save": at_save, "after_next_step": strategy.module_full_state_dict()}


def _resume_with_swapped_sub_groups_refused(root: str) -> tuple[str, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    strategy, model, optimizer = _wide_run(str(Path(root) / "nvme-resumed"))
    before = strategy.module_full_state_dict()
    try:
        strategy.load_checkpoint(Path(root) / "checkpoint", {"module": model, "optimizers": [optimizer]})
        error = ""
    except RuntimeError as refused:
        error = str(refused)
    return error, before, strategy.module_full_state_dict()


def _resume_with_the_optimizer_on_cpu_then_step(root: str) -> dict[str, torch.Tensor]:
    strategy, model, optimizer = _wide_run("", name="deepspeed_stage_3_offload")
    strategy.load_checkpoint(Path(root) / "checkpoint", {"module": model, "optimizers": [optimizer]})
    _wide_step(strategy, model, optimizer, 1)
    return strategy.module_full_state_dict()


@pytest.fixture(scope="module")
def swapped_sub_groups(tmp_path_factory) -> tuple[Path, dict[str, Any], Any, dict[str, torch.Tensor]]:
    root = tmp_path_factory.mktemp("swapped")
    with DistributedWorkers(2, env=WORKER_ENV) as workers:
        saved = workers.run(_save_with_swapped_sub_groups_then_step, str(root), timeout=840)[0]
        refused = workers.run(_resume_with_swapped_sub_groups_refused, str(root), timeout=840)
        resumed = workers.run(_resume_with_the_optimizer_on_cpu_then_step, str(root), timeout=840)[0]
    return root / "checkpoint", saved, refused, resumed


def test_a_checkpoint_with_optimizer_sub_groups_swapped_to_nvme_holds_their_master_weights(swapped_sub_groups):
    from stratagem_deepspeed.checkpoint_io import read_checkpoint

    path, saved, _, _ = swapped_sub_groups
    assert saved["swapped"] == [0, 1, 2, 3]
    checkpoint = read_checkpoint(path)
    assert checkpoint["module"].keys() == saved["at_save"].keys()
    for name, value in saved["at_save"].items():
        torch.testing.assert_close(checkpoint["module"][name], value, atol=0, rtol=0, msg=name)
    [optimizer_state] = checkpoint["optimizers"]
    assert len(optimizer_state["state"]) == len(saved["at_save"])
    for per_parameter in optimizer_state["state"].values():
        assert per_parameter["exp_avg_sq"].abs().sum() > 0


def test_a_checkpoint_with_swapped_sub_groups_resumes_with_the_optimizer_on_cpu_like_the_run_that_saved_it(
    swapped_sub_groups,
):
    _, saved, _, resumed = swapped_sub_groups
    assert not torch.equal(saved["after_next_step"]["layers.0.weight"], saved["at_save"]["layers.0.weight"])
    for name, value in saved["after_next_step"].items():
        torch.testing.assert_close(resumed[name], value, atol=1e-6, rtol=0, msg=name)


def test_loading_into_a_run_with_swapped_sub_groups_is_refused_before_changing_anything(swapped_sub_groups):
    _, _, refused, _ = swapped_sub_groups
    for error, _, _ in refused:
        assert "4 of the optimizer's 5 sub-groups are swapped out to NVMe" in error
        assert "offload_optimizer_device='cpu'" in error
    _, before, after = refused[0]
    for name, value in before.items():
        torch.testing.assert_close(after[name], value, atol=0, rtol=0, msg=name)
