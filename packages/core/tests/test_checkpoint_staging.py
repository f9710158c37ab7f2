"""The one staging protocol (stratagem.checkpoint_io.staging): a checkpoint directory that several ranks write
appears whole under its name, or not at all, and every rank learns how the write ended."""

import errno

import pytest
import torch.distributed as dist

from stratagem.checkpoint_io import write_staged
from stratagem.checkpoint_io.staging import ProcessGroupRanks
from stratagem.testing import DistributedWorkers

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def workers():
    with DistributedWorkers(2, env={"OMP_NUM_THREADS": "1"}) as pool:
        yield pool


def _previous(target):
    target.mkdir()
    (target / "old").write_text("previous")


def _write(target, failing_rank, failing_step):
    from pathlib import Path

    target = Path(target)
    rank = dist.get_rank()

    def write_part(staging):
        if failing_step == "part" and rank == failing_rank:
            raise OSError(errno.ENOSPC, "No space left on device", str(staging / f"part_{rank}"))
        (staging / f"part_{rank}").write_text(str(rank))

    def complete(staging):
        if failing_step == "complete":
            raise ValueError("the plain entries cannot be written")
        (staging / "plain").write_text("plain")

    try:
        write_staged(target, ProcessGroupRanks(), write_part, complete)
    except (OSError, RuntimeError, ValueError) as error:
        return f"{type(error).__name__}: {error}"
    return "written"


def test_every_rank_part_and_rank_zero_completion_appear_under_the_name_together(workers, tmp_path):
    target = tmp_path / "checkpoint"
    _previous(target)
    outcomes = workers.run(_write, str(target), None, None)
    assert outcomes == ["written", "written"]
    assert sorted(path.name for path in target.iterdir()) == ["part_0", "part_1", "plain"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["checkpoint"]


@pytest.mark.parametrize("failing_rank", [0, 1])
def test_a_part_that_fails_on_one_rank_publishes_nothing_and_every_rank_raises(workers, tmp_path, failing_rank):
    target = tmp_path / "checkpoint"
    _previous(target)
    outcomes = workers.run(_write, str(target), failing_rank, "part")
    failed, other = outcomes[failing_rank], outcomes[1 - failing_rank]
    assert failed.startswith("OSError")
    assert "disk is full (ENOSPC" in failed
    assert f"part_{failing_rank}" in failed
    assert other.startswith("RuntimeError")
    assert "failed on another rank" in other
    assert [path.name for path in target.iterdir()] == ["old"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["checkpoint"]


def test_a_completion_that_fails_on_rank_zero_is_named_on_every_rank(workers, tmp_path):
    target = tmp_path / "checkpoint"
    _previous(target)
    outcomes = workers.run(_write, str(target), None, "complete")
    assert outcomes[0] == "ValueError: the plain entries cannot be written"
    assert outcomes[1].startswith("RuntimeError")
    assert "failed on rank 0: ValueError" in outcomes[1]
    assert [path.name for path in target.iterdir()] == ["old"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["checkpoint"]


def test_one_process_without_a_group_writes_the_directory_alone(tmp_path):
    target = tmp_path / "checkpoint"
    write_staged(target, ProcessGroupRanks(), lambda staging: (staging / "part").write_text("x"))
    assert [path.name for path in target.iterdir()] == ["part"]
