"""A sharded save that runs out of disk says so (ENOSPC), naming the checkpoint and the file, on every rank;
nothing is lost. The disk is a 200 kB tmpfs, which mounting needs root for."""

import errno
import functools
import os
import subprocess

import pytest
import torch
from fsdp_testing import Block, Net, build, make_strategy

from stratagem.checkpoint_io.sharded import DistributedCheckpointIO
from stratagem.testing import DistributedWorkers

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def small_disk(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting the 200 kB tmpfs that is filled needs root")
    mount = tmp_path / "small_disk"
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(mount)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        # Lazily if a failed save left a file open (a traceback pytest keeps may hold it).
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "--lazy", str(mount)], check=True)


def _previous_checkpoint(directory):
    DistributedCheckpointIO().save_checkpoint({"module": {"w": torch.ones(4)}, "loops": {"step": 1}}, directory)
    return {path.name: path.read_bytes() for path in directory.iterdir()}


@pytest.mark.parametrize("overflowing", ["a shard", "plain_state.pt"])
def test_a_save_that_fills_the_disk_names_enospc_and_the_file_and_keeps_the_previous_checkpoint(
    small_disk, overflowing
):
    target = small_disk / "checkpoint"
    before = _previous_checkpoint(target)
    large = torch.randn(60_000)  # 240 kB
    state = {"module": {"w": large}, "loops": {"step": 2}} if overflowing == "a shard" else {"loops": [large]}
    with pytest.raises(OSError, match="disk is full") as raised:
        DistributedCheckpointIO().save_checkpoint(state, target)
    message = str(raised.value)
    assert raised.value.errno == errno.ENOSPC
    assert f"checkpoint {str(target)!r} failed" in message
    assert ("__0_0.distcp" if overflowing == "a shard" else "plain_state.pt'") in message, message
    assert "unexpected pos" not in message
    assert {path.name: path.read_bytes() for path in target.iterdir()} == before
    assert sorted(path.name for path in small_disk.iterdir()) == ["checkpoint"]


def _save_a_sharded_model(directory):
    strategy = make_strategy(auto_wrap_policy={Block})
    module, optimizer = build(strategy, module_class=functools.partial(Net, width=160))
    try:
        strategy.save_checkpoint(directory, {"module": module, "optimizers": [optimizer]})
    except (OSError, RuntimeError) as error:
        return f"{type(error).__name__}: {error}"
    return "saved"


def test_fsdp_on_two_ranks_names_the_full_disk_on_every_rank(small_disk):
    with DistributedWorkers(2, env={"OMP_NUM_THREADS": "1"}) as workers:
        outcomes = workers.run(_save_a_sharded_model, str(small_disk / "checkpoint"))
    assert all("disk is full (ENOSPC" in outcome for outcome in outcomes), outcomes
    assert all("checkpoint'" in outcome and ".distcp'" in outcome for outcome in outcomes), outcomes
    assert list(small_disk.iterdir()) == []
