"""The Trainer on two real processes (gloo) started by spawn: the caller is not a worker.

The strategy here is the smallest parallel one: ParallelStrategy's process group and
collectives, gradients averaged after backward. It stands in for the backend packages so
that core's tests check what the Trainer owes every parallel strategy: data split per rank,
saving on every rank, results equal on every rank, and the outcome sent back to the caller.
"""

import os
import time

import pytest
import torch
import torch.distributed as dist
from torch.nn import functional
from trainer_testing import ClassifierModule, assert_bitwise_equal, make_loader, parameters_of, quiet_trainer

from stratagem.callbacks import Callback, ModelCheckpoint
from stratagem.launchers import RankFailedError, create_launcher
from stratagem.strategies import ParallelStrategy

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(240)]


class GradientAveragingStrategy(ParallelStrategy):
    @property
    def launcher(self):
        return create_launcher("spawn", self._environment, self.num_processes, self.num_nodes)

    def backward(self, loss, optimizer):
        super().backward(loss, optimizer)
        for parameter in self.module.parameters():
            if parameter.grad is not None:
                dist.all_reduce(parameter.grad)
                parameter.grad /= self.world_size


class RankAwareModule(ClassifierModule):
    """Logs a rank-dependent value both synced and not, and records what each rank saw."""

    def validation_step(self, batch, batch_idx, *args):
        super().validation_step(batch, batch_idx)
        rank = float(self.global_rank)
        self.log("rank_synced", rank, sync_dist=True)
        self.log("rank_local", rank)
        self.log("samples", float(len(batch[0])), reduce_fx="sum", sync_dist=True)


class SaveCounter(Callback):
    def __init__(self):
        self.saves = 0

    def on_save_checkpoint(self, trainer, module, checkpoint):
        self.saves += 1

    def state_dict(self):
        return {"saves": self.saves}

    def load_state_dict(self, state):
        self.saves = state["saves"]


@pytest.fixture(scope="module", autouse=True)
def _restore_rendezvous_variables():
    """Launching exports MASTER_PORT into this process; tests of other modules must not inherit it."""
    saved = {name: os.environ.get(name) for name in ("MASTER_ADDR", "MASTER_PORT")}
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _two_process_trainer(root, **options):
    return quiet_trainer(root, strategy=GradientAveragingStrategy(), devices=2, **options)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """One two-process fit, reused by the checks below (starting processes costs seconds)."""
    root = tmp_path_factory.mktemp("two_ranks")
    torch.manual_seed(0)
    module = RankAwareModule()
    initial = parameters_of(module)
    checkpoint, counter = ModelCheckpoint(save_last=True), SaveCounter()
    trainer = _two_process_trainer(
        root, max_epochs=2, enable_checkpointing=True, callbacks=[counter, checkpoint], logger=True
    )
    trainer.fit(module, make_loader(num_samples=32, batch_size=4), make_loader(num_samples=16, batch_size=4))
    return root, trainer, module, initial


def test_the_callers_module_holds_the_trained_weights_of_a_full_batch_run(fitted, tmp_path):
    _, trainer, module, initial = fitted
    # Two ranks with batches of 4 average to the gradient of one batch of 8 in one process.
    reference = RankAwareModule()
    reference.load_state_dict(initial)
    quiet_trainer(tmp_path, max_epochs=2).fit(reference, make_loader(num_samples=32, batch_size=8))
    for name, value in parameters_of(reference).items():
        torch.testing.assert_close(parameters_of(module)[name], value, rtol=1e-5, atol=1e-6)
    assert (trainer.global_step, trainer.current_epoch) == (8, 2)
    assert module.trainer is trainer


def test_metrics_and_callback_state_come_back_to_the_caller(fitted):
    root, trainer, _, _ = fitted
    assert float(trainer.callback_metrics["rank_synced"]) == 0.5
    assert float(trainer.callback_metrics["rank_local"]) == 0.0
    assert float(trainer.callback_metrics["samples"]) == 16.0
    assert trainer.callbacks[0].saves == 4  # at both epoch ends: the top-k checkpoint and last.ckpt
    assert trainer.checkpoint_callback.best_model_path == str(
        root / "checkpoints" / "version_0" / "epoch=1-step=8.ckpt"
    )
    assert trainer.throughput.steps == 8


def test_every_rank_saved_and_only_rank_zero_wrote_files(fitted):
    root, _, module, _ = fitted
    assert sorted(path.name for path in (root / "checkpoints" / "version_0").iterdir()) == [
        "epoch=1-step=8.ckpt",
        "last.ckpt",
    ]
    saved = torch.load(root / "checkpoints" / "version_0" / "last.ckpt", weights_only=True)
    assert_bitwise_equal(saved["module"], parameters_of(module))
    assert [path.name for path in (root / "csv_logs").iterdir()] == ["version_0"]
    assert fitted[1].logger.version == 0


def test_validate_gives_every_rank_the_same_results(fitted):
    _, trainer, module, _ = fitted
    (results,) = trainer.validate(module, make_loader(num_samples=16, batch_size=4))
    assert results["rank_synced"] == 0.5
    assert results["rank_local"] == 0.0  # rank 0's value, on every rank
    assert results["samples"] == 16.0


def test_resuming_on_two_ranks_from_the_last_checkpoint_continues_the_run(fitted):
    root, _, _, _ = fitted
    resumed_module = RankAwareModule()
    trainer = _two_process_trainer(root, max_epochs=3, enable_checkpointing=True, callbacks=[ModelCheckpoint()])
    trainer.fit(resumed_module, make_loader(num_samples=32, batch_size=4), ckpt_path="last")
    assert (trainer.global_step, trainer.current_epoch) == (12, 3)


def test_predict_returns_rank_zeros_share(fitted, tmp_path):
    _, _, module, _ = fitted
    loader = make_loader(num_samples=16, batch_size=4)
    predictions = _two_process_trainer(tmp_path).predict(module, loader)
    features = loader.dataset.tensors[0][0::2]  # rank 0's samples under a DistributedSampler
    assert torch.equal(torch.cat(predictions), module(features).argmax(1))


class FailsOnRankOne(ClassifierModule):
    def training_step(self, batch, batch_idx):
        if self.global_rank == 1:
            raise RuntimeError("rank one gives up")
        return functional.cross_entropy(self(batch[0]), batch[1])


def test_a_failing_rank_reports_its_error_to_the_caller(tmp_path):
    with pytest.raises(RankFailedError, match="rank one gives up"):
        _two_process_trainer(tmp_path, max_steps=2).fit(FailsOnRankOne(), make_loader())


class SkipsOnRankOne(ClassifierModule):
    """Returns None for batch 2 on rank 1 only: the ranks disagree on whether the step has a loss."""

    def training_step(self, batch, batch_idx):
        if batch_idx == 2 and self.global_rank == 1:
            return None
        return super().training_step(batch, batch_idx)


def test_ranks_that_disagree_on_having_a_loss_fail_at_that_batch_naming_them_instead_of_hanging(tmp_path):
    started = time.monotonic()
    with pytest.raises(RankFailedError) as caught:
        _two_process_trainer(tmp_path, max_steps=6).fit(SkipsOnRankOne(), make_loader())
    assert time.monotonic() - started < 60
    assert (
        "The ranks disagree at batch_idx 2 of epoch 0 (global_step 2): training_step returned None on rank 1 and a "
        "loss on rank 0" in str(caught.value)
    )
