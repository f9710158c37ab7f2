"""Before a run, global rank 0 decides the checkpoint to start from and every rank checks that it can read it;
before training, every rank checks that it sees the checkpoint directories rank 0 saves into.

Two real ranks on one machine stand in for two machines by looking at the same relative path from different
working directories: each sees its own file there, as nodes with their own disks do.
(``tox -e multihost`` runs the same through whole fits on two hosts with their own mounts.)
"""

import os
import socket
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from stratagem.accelerators import CPUAccelerator
from stratagem.callbacks import ModelCheckpoint
from stratagem.checkpoint_io import CheckpointError
from stratagem.environments import TorchElasticEnvironment
from stratagem.runtime import Runtime
from stratagem.strategies import ParallelStrategy
from stratagem.testing import DistributedWorkers
from stratagem.trainer.agreement import agree_on_checkpoint, check_checkpoint_directories_shared

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(120)]


class _ShardWritingStrategy(ParallelStrategy):
    """The collectives of every parallel strategy, declaring that every rank writes its shards."""

    @property
    def checkpoint_written_by_every_rank(self) -> bool:
        return True


@pytest.fixture(scope="module")
def workers():
    with DistributedWorkers(2, env={"TORCHELASTIC_RUN_ID": "agreement", "GROUP_RANK": "0"}) as pool:
        yield pool


def _trainer(every_rank_writes: bool = False, dirpath: str | None = None) -> SimpleNamespace:
    kind = _ShardWritingStrategy if every_rank_writes else ParallelStrategy
    strategy = kind(
        accelerator=CPUAccelerator(),
        parallel_devices=[torch.device("cpu")] * 2,
        cluster_environment=TorchElasticEnvironment(),
    )
    callbacks = [ModelCheckpoint(dirpath=dirpath)] if dirpath is not None else []
    return SimpleNamespace(strategy=strategy, runtime=Runtime.around(strategy), checkpoint_callbacks=callbacks)


def _own_directory(root: str) -> None:
    """Work in a directory of this rank's own, holding ``checkpoints/`` with ``step=N.ckpt`` for rank 0 only."""
    here = Path(root, f"rank-{dist.get_rank()}")
    (here / "checkpoints").mkdir(parents=True, exist_ok=True)
    os.chdir(here)


def _agree(root: str, own_by_rank: list[str | None]) -> tuple[str, str | None]:
    _own_directory(root)
    own = own_by_rank[dist.get_rank()]
    if own is not None:
        Path(own).write_bytes(b"a checkpoint")
    try:
        return "agreed", agree_on_checkpoint(_trainer(), own)
    except CheckpointError as error:
        return "failed", str(error)


def test_a_checkpoint_rank_0_chose_that_another_host_cannot_read_fails_every_rank_naming_the_host(workers, tmp_path):
    results = workers.run(_agree, str(tmp_path / "unreadable"), ["checkpoints/step=4.ckpt", None])
    for outcome, message in results:
        assert outcome == "failed"
        assert "resumes from 'checkpoints/step=4.ckpt', which host " in message
        assert "(rank 1: No such file or directory) cannot read" in message
        assert "on a filesystem every node mounts" in message


def test_rank_0_training_from_scratch_while_another_rank_found_a_checkpoint_fails_every_rank(workers, tmp_path):
    results = workers.run(_agree, str(tmp_path / "scratch"), [None, "checkpoints/step=2.ckpt"])
    for outcome, message in results:
        assert outcome == "failed"
        assert "found none and would train from scratch, but rank 1 (host " in message
        assert "found checkpoints/step=2.ckpt" in message


def test_every_rank_takes_rank_0s_checkpoint_when_it_can_read_it(workers, tmp_path):
    shared = tmp_path / "shared.ckpt"
    shared.write_bytes(b"a checkpoint")
    other = tmp_path / "newer-on-rank-1.ckpt"
    assert workers.run(_agree, str(tmp_path / "agree"), [str(shared), str(other)]) == [
        ("agreed", str(shared)),
        ("agreed", str(shared)),
    ]


def _check_shared(root: str, every_rank_writes: bool) -> tuple[str, str, list[str]]:
    _own_directory(root)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            check_checkpoint_directories_shared(_trainer(every_rank_writes, dirpath="checkpoints"))
            outcome = "passed"
        except RuntimeError as error:
            outcome = str(error)
    left = sorted(path.name for path in Path("checkpoints").iterdir())
    return outcome, "\n".join(str(warning.message) for warning in caught), left


def test_a_checkpoint_directory_not_every_host_sees_is_refused_where_every_rank_writes_shards(workers, tmp_path):
    results = workers.run(_check_shared, str(tmp_path / "shards"), True)
    for outcome, _, left in results:
        assert "The checkpoint directory 'checkpoints' is not one filesystem for every node" in outcome
        assert "created a file there that host " in outcome
        assert "(rank 1) cannot see" in outcome
        assert "_ShardWritingStrategy writes each checkpoint from every rank" in outcome
        assert "state_dict_type='full'" in outcome
        assert left == []  # the marker is gone


def test_a_checkpoint_directory_not_every_host_sees_is_a_warning_where_rank_0_writes_alone(workers, tmp_path):
    (outcome_0, warned_0, _), (outcome_1, warned_1, _) = workers.run(_check_shared, str(tmp_path / "whole"), False)
    assert (outcome_0, outcome_1) == ("passed", "passed")
    assert "exist on its node only" in warned_0
    assert warned_1 == ""


def _model_paths_after_check_shared(root: str) -> tuple[str | None, str, str]:
    _own_directory(root)
    trainer = _trainer(dirpath="checkpoints")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_checkpoint_directories_shared(trainer)
    (callback,) = trainer.checkpoint_callbacks
    callback.best_model_path = "checkpoints/epoch=0-step=4.ckpt"  # as a save at step 4 records it on every rank
    return callback.files_host, callback.best_model_path, callback.last_model_path


def test_where_a_node_does_not_see_the_checkpoint_directory_its_model_paths_name_the_host_holding_them(
    workers, tmp_path
):
    results = workers.run(_model_paths_after_check_shared, str(tmp_path / "paths"))
    host = socket.gethostname()  # rank 0's: both ranks run here
    assert results == [
        (None, "checkpoints/epoch=0-step=4.ckpt", ""),
        (host, f"{host}:checkpoints/epoch=0-step=4.ckpt", ""),
    ]


def test_a_checkpoint_directory_every_rank_sees_passes_silently(workers, tmp_path):
    shared = str(tmp_path / "one-directory")
    results = workers.run(_check_shared_absolute, shared)
    assert results == [("passed", "", []), ("passed", "", [])]


def _check_shared_absolute(directory: str) -> tuple[str, str, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_checkpoint_directories_shared(_trainer(True, dirpath=directory))
    dist.barrier()
    return "passed", "\n".join(str(warning.message) for warning in caught), sorted(os.listdir(directory))
