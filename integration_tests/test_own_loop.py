"""The documented own loop (examples/own_loop/runtime_loop.py) on two ranks of ddp, fsdp and the local-SGD example
plugin: every rank's losses and the final weights are the Trainer's on the same data, to 1e-5; fsdp's sharded
checkpoints go from the own loop to the Trainer and back.

One pair of worker processes (ranks as torchrun would start them) runs every check.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn import functional
from torch.utils.data import DataLoader

import stratagem
from stratagem.callbacks import Callback
from stratagem.demo import DemoModule, make_classification
from stratagem.testing import DistributedWorkers

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]

REPOSITORY = Path(__file__).resolve().parents[1]
EXAMPLE_PATHS = [str(REPOSITORY / "examples" / "own_loop"), str(REPOSITORY / "examples" / "local_sgd" / "src")]
WORKER_ENV = {"TORCHELASTIC_RUN_ID": "stratagem-own-loop", "GROUP_RANK": "0", "OMP_NUM_THREADS": "1"}
SAMPLES, BATCH, SEED = 256, 32, 1234
STEPS_PER_RANK = SAMPLES // BATCH // 2


def _strategy(name: str) -> Any:
    if name == "local_sgd":
        from stratagem_local_sgd.strategy import LocalSGDStrategy

        return LocalSGDStrategy(average_every=2)
    return name


def _runtime(name: str) -> stratagem.Runtime:
    return stratagem.Runtime(strategy=_strategy(name), accelerator="cpu", devices=2)


def _loader() -> DataLoader:
    return DataLoader(make_classification(SAMPLES), batch_size=BATCH)


class _Record(Callback):
    """Each step's loss on this rank, and the whole weights at the end of the run (while it is live)."""

    def __init__(self, save_to: str | None = None) -> None:
        self.losses: list[float] = []
        self.weights: dict[str, torch.Tensor] = {}
        self.save_to = save_to

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs.detach()))

    def on_train_end(self, trainer, module) -> None:
        self.weights = trainer.strategy.module_full_state_dict()
        if self.save_to is not None:
            trainer.save_checkpoint(self.save_to)


def _trainer_run(name: str, max_steps: int, ckpt_path: str | None = None, save_to: str | None = None):
    record = _Record(save_to)
    trainer = stratagem.Trainer(
        strategy=_strategy(name),
        accelerator="cpu",
        devices=2,
        max_steps=max_steps,
        seed=SEED,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        num_sanity_val_steps=0,
        callbacks=[record],
    )
    trainer.fit(DemoModule(), _loader(), ckpt_path=ckpt_path)
    return record.losses, record.weights


def _documented_loop(runtime: stratagem.Runtime):
    from runtime_loop import train

    losses = train(runtime, samples=SAMPLES, batch_size=BATCH, seed=SEED)
    return losses, runtime.strategy.module_full_state_dict()


def _own_and_trainer_runs(name: str):
    return _runtime(name).launch(_documented_loop), _trainer_run(name, STEPS_PER_RANK)


def _continued_loop(runtime, checkpoint_in: str | None, checkpoint_out: str | None, first_batch: int, steps: int):
    """The demo's own loop, from ``checkpoint_in`` (when given) at ``first_batch``, for ``steps`` steps; saved to
    ``checkpoint_out`` with the Trainer's entry names."""
    torch.manual_seed(SEED)
    model = DemoModule()
    model.configure_model()
    model = runtime.setup_module(model)
    optimizer = runtime.setup_optimizers(
        torch.optim.AdamW(model.parameters(), lr=model.learning_rate, weight_decay=0.01)
    )
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=2 * steps)
    state = {"module": model, "optimizers": [optimizer], "lr_schedulers": [scheduler]}
    if checkpoint_in is not None:
        runtime.load(checkpoint_in, state)
    for batch_idx, (features, labels) in enumerate(runtime.setup_dataloaders(_loader())):
        if first_batch <= batch_idx < first_batch + steps:
            runtime.backward(functional.cross_entropy(model(features), labels))
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()
    if checkpoint_out is not None:
        runtime.save(checkpoint_out, state)
    return runtime.strategy.module_full_state_dict()


def _checkpoints_both_ways(name: str, directory: str):
    own_checkpoint, trainer_checkpoint = f"{directory}/own", f"{directory}/trainer"
    runtime = _runtime(name)
    runtime.launch(_continued_loop, None, own_checkpoint, 0, 2)
    own_resumed = runtime.launch(_continued_loop, own_checkpoint, None, 0, 2)
    # Without loop state in the own loop's checkpoint, the Trainer starts at the first batch again.
    _, trainer_resumed = _trainer_run(name, 2, ckpt_path=own_checkpoint)
    _trainer_run(name, 2, save_to=trainer_checkpoint)
    _, trainer_continued = _trainer_run(name, 4, ckpt_path=trainer_checkpoint)
    own_continued = runtime.launch(_continued_loop, trainer_checkpoint, None, 2, 2)
    return (own_resumed, trainer_resumed), (own_continued, trainer_continued), Path(own_checkpoint).is_dir()


@pytest.fixture(scope="module")
def workers():
    sys.path[:0] = EXAMPLE_PATHS
    try:
        with DistributedWorkers(2, env=WORKER_ENV) as pool:
            yield pool
    finally:
        for path in EXAMPLE_PATHS:
            sys.path.remove(path)


def _assert_weights_close(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> None:
    assert first.keys() == second.keys()
    assert first
    for key in first:
        torch.testing.assert_close(first[key], second[key], rtol=0, atol=1e-5, msg=key)


@pytest.mark.parametrize("name", ["ddp", "fsdp", "local_sgd"])
def test_the_documented_own_loop_trains_as_the_trainer_on_every_rank(workers, name):
    results = workers.run(_own_and_trainer_runs, name, timeout=240)
    rank_zero_weights = None
    for (own_losses, own_weights), (trainer_losses, trainer_weights) in results:
        assert len(own_losses) == len(trainer_losses) == STEPS_PER_RANK
        torch.testing.assert_close(torch.tensor(own_losses), torch.tensor(trainer_losses), rtol=0, atol=1e-5)
        if own_weights:  # rank 0 gets the whole weights; a sharded strategy may give the others nothing
            _assert_weights_close(own_weights, trainer_weights)
            rank_zero_weights = rank_zero_weights or own_weights
    assert rank_zero_weights is not None
    # The ranks read different data: their losses differ, and the run was a real two-rank one.
    assert results[0][0][0] != results[1][0][0]


def test_fsdp_sharded_checkpoints_go_from_the_own_loop_to_the_trainer_and_back(workers, tmp_path):
    results = workers.run(_checkpoints_both_ways, "fsdp", str(tmp_path), timeout=240)
    (own_resumed, trainer_resumed), (own_continued, trainer_continued), sharded = results[0]
    assert sharded, "fsdp saves a directory of shards by default"
    _assert_weights_close(own_resumed, trainer_resumed)
    _assert_weights_close(own_continued, trainer_continued)


def _documented_loop_losses(runtime: stratagem.Runtime) -> list[float]:
    return _documented_loop(runtime)[0]


def _ddp_losses_in_the_pool() -> list[float]:
    return _runtime("ddp").launch(_documented_loop_losses)


@pytest.mark.timeout(180)
def test_launch_forks_the_ranks_itself_and_returns_rank_zeros_result(workers):
    sys.path[:0] = EXAMPLE_PATHS
    try:
        forked = stratagem.Runtime(strategy="ddp_fork", accelerator="cpu", devices=2).launch(_documented_loop_losses)
    finally:
        for path in EXAMPLE_PATHS:
            sys.path.remove(path)
    in_the_pool = workers.run(_ddp_losses_in_the_pool, timeout=120)
    assert forked == in_the_pool[0]
