"""stratagem.seed_everything: the global generators, and with ``workers=True`` each DataLoader worker's."""

from __future__ import annotations

import os
import random
from typing import Any

import numpy
import pytest
import torch
from torch.utils.data import DataLoader, Dataset
from trainer_testing import ClassifierModule

import stratagem
from stratagem.trainer.rng import SEED_WORKERS_VARIABLE, SeedWorker


class RandomDrawsDataset(Dataset):
    """Each item is features plus what Python's, numpy's and torch's generators drew in the worker that made it."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> Any:
        draws = torch.tensor([random.random(), float(numpy.random.rand()), float(torch.rand(()))])
        features = torch.full((8,), float(index)) + draws.sum()
        return features, torch.tensor(index % 2), draws, torch.utils.data.get_worker_info().id


class RecordingModule(ClassifierModule):
    def __init__(self) -> None:
        super().__init__()
        self.draws: list[torch.Tensor] = []
        self.worker_ids: list[torch.Tensor] = []
        self.losses: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        features, labels, draws, worker_ids = batch
        self.draws.append(draws)
        self.worker_ids.append(worker_ids)
        loss = super().training_step((features, labels), batch_idx)
        self.losses.append(float(loss.detach()))
        return loss


def _fit_with_workers(tmp_path: Any, worker_init_fn: Any = None) -> RecordingModule:
    stratagem.seed_everything(5, workers=True)
    module = RecordingModule()
    loader = DataLoader(RandomDrawsDataset(), batch_size=4, shuffle=True, num_workers=2, worker_init_fn=worker_init_fn)
    trainer = stratagem.Trainer(
        accelerator="cpu",
        max_epochs=2,
        seed=5,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, loader)
    assert loader.worker_init_fn is worker_init_fn, "the user's loader is left as given"
    return module


def test_two_fits_with_seeded_workers_give_the_same_batches_and_losses_and_each_worker_draws_its_own(
    tmp_path, monkeypatch
):
    monkeypatch.setenv(SEED_WORKERS_VARIABLE, "0")
    first, second = _fit_with_workers(tmp_path), _fit_with_workers(tmp_path)
    assert len(first.draws) == 8
    assert all(torch.equal(a, b) for a, b in zip(first.draws, second.draws, strict=True))
    assert first.losses == second.losses
    draws, workers = torch.cat(first.draws), torch.cat(first.worker_ids)
    assert set(workers.tolist()) == {0, 1}
    # Without seeding numpy's generator is the same copy in both workers: their first numpy draws would be equal.
    firsts = {int(worker): draws[workers == worker][0] for worker in (0, 1)}
    for library in range(3):
        assert firsts[0][library] != firsts[1][library]
    # The two epochs draw differently (a new base seed per epoch), and nothing repeats within the run.
    assert len(set(draws[:, 1].tolist())) == len(draws)


def test_seeded_workers_still_run_the_loaders_own_worker_init_fn(tmp_path, monkeypatch):
    monkeypatch.setenv(SEED_WORKERS_VARIABLE, "0")
    module = _fit_with_workers(tmp_path, worker_init_fn=_reseed_numpy)
    draws, workers = torch.cat(module.draws), torch.cat(module.worker_ids)
    # The user's function ran after the seeding (it reseeds numpy alike in every worker), so both workers
    # start from RandomState(123): each worker makes 8 items per epoch.
    expected = numpy.random.RandomState(123).rand(8).tolist()
    for worker in (0, 1):
        assert draws[workers == worker][:8, 1].tolist() == pytest.approx(expected)


def _reseed_numpy(worker_id: int) -> None:
    numpy.random.seed(123)


def test_seed_everything_is_public_and_seeds_the_global_generators(monkeypatch):
    monkeypatch.setenv(SEED_WORKERS_VARIABLE, "1")
    assert stratagem.seed_everything(3) == 3
    first = (random.random(), float(numpy.random.rand()), float(torch.rand(())))
    stratagem.seed_everything(3)
    assert (random.random(), float(numpy.random.rand()), float(torch.rand(()))) == first

    assert os.environ[SEED_WORKERS_VARIABLE] == "0", "a later call without workers=True turns worker seeding off"


@pytest.mark.parametrize(("seed", "error"), [(-1, ValueError), (2**63, ValueError), (1.5, ValueError)])
def test_seed_everything_refuses_a_seed_outside_what_torch_takes(seed, error):
    with pytest.raises(error, match=r"seed_everything\(seed="):
        stratagem.seed_everything(seed)


def test_workers_of_different_ranks_get_different_seeds_from_the_same_base():
    def draws_of(rank: int) -> tuple[float, float, float]:
        torch.manual_seed(100)  # what torch gives worker 0 when the loader's base seed is 100
        SeedWorker(rank, then=None)(0)
        return random.random(), float(numpy.random.rand()), float(torch.rand(()))

    rank0, rank1 = draws_of(0), draws_of(1)
    assert draws_of(0) == rank0
    assert all(a != b for a, b in zip(rank0, rank1))
