"""plugins="async" with fsdp's sharded checkpoints: DCP's async_save on 2 ranks, failures raised on every rank,
and no checkpoint removed before the one replacing it is complete."""

import os

import pytest
import torch
from fsdp_testing import build, global_batches, train
from torch.distributed.checkpoint import FileSystemWriter

import stratagem
from stratagem.checkpoint_io import TorchCheckpointIO, read_full_checkpoint
from stratagem.testing import DistributedWorkers
from stratagem_fsdp import AsyncDistributedCheckpointIO, FSDPStrategy

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def workers():
    with DistributedWorkers(2, env={"OMP_NUM_THREADS": "1"}) as pool:
        yield pool


def _async_strategy() -> FSDPStrategy:
    strategy = stratagem.resolve(strategy="fsdp", accelerator="cpu", devices=2, plugins="async")
    assert isinstance(strategy, FSDPStrategy)
    assert isinstance(strategy.checkpoint_io, AsyncDistributedCheckpointIO)
    strategy.setup_environment()
    return strategy


def _save_while_training(directory):
    """Two checkpoints saved in the background while training changes the weights; what each should hold."""
    strategy = _async_strategy()
    module, optimizer = build(strategy)
    expected = {}
    for name, seed in (("first", 1), ("second", 2)):
        train(strategy, optimizer, global_batches(2, seed=seed))
        strategy.save_checkpoint(os.path.join(directory, name), {"module": module, "optimizers": [optimizer]})
        expected[name] = strategy.module_full_state_dict()
        # Changes every weight while the write is (likely) still going on.
        train(strategy, optimizer, global_batches(2, seed=3))
    strategy.teardown()
    return expected


def test_async_checkpoints_hold_the_weights_of_the_step_they_were_saved_at(workers, tmp_path):
    expected = workers.run(_save_while_training, str(tmp_path))[0]
    for name, weights in expected.items():
        saved = read_full_checkpoint(tmp_path / name, TorchCheckpointIO())["module"]
        assert saved.keys() == weights.keys()
        for key, value in weights.items():
            assert torch.equal(saved[key], value), (name, key)
    assert sorted(os.listdir(tmp_path)) == ["first", "second"]


def _replace_with_a_failing_write(directory):
    """Save "kept"; then a save whose rank-1 write fails, followed by the removal of "kept" that a top k asks for."""
    strategy = _async_strategy()
    module, optimizer = build(strategy)
    state = {"module": module, "optimizers": [optimizer], "note": "kept"}
    strategy.save_checkpoint(os.path.join(directory, "kept"), state)
    strategy.checkpoint_io.wait()  # "kept" is whole before rank 1's writes start failing
    write_data = FileSystemWriter.write_data
    if torch.distributed.get_rank() == 1:

        def fail(*args, **kwargs):
            raise OSError("No space left on device (injected)")

        FileSystemWriter.write_data = fail
    try:
        strategy.save_checkpoint(os.path.join(directory, "new"), {**state, "note": "new"})
        strategy.remove_checkpoint(os.path.join(directory, "kept"))
        strategy.teardown()
    except RuntimeError as error:
        return str(error)
    finally:
        FileSystemWriter.write_data = write_data
    return None


def test_a_failed_background_write_is_raised_on_every_rank_and_keeps_the_checkpoint_it_replaces(workers, tmp_path):
    errors = workers.run(_replace_with_a_failing_write, str(tmp_path))
    for error in errors:
        assert error is not None
        assert "in the background failed: OSError: No space left on device (injected) (writing on rank 1)" in error
        assert "No space left on device (injected)" in error
        assert "were kept" in error
    # The removal asked for after the failed write did not run, and the failed write left nothing behind.
    assert os.listdir(tmp_path) == ["kept"]
    assert read_full_checkpoint(tmp_path / "kept", TorchCheckpointIO())["note"] == "kept"


def _save_an_unpicklable_entry(directory):
    strategy = _async_strategy()
    module, optimizer = build(strategy)
    state = {"module": module, "optimizers": [optimizer], "note": lambda: "torch.save cannot write this"}
    strategy.save_checkpoint(os.path.join(directory, "checkpoint"), state)
    try:
        strategy.teardown()
    except RuntimeError as error:
        return str(error)
    return None


def test_a_failure_completing_the_directory_on_rank_0_is_raised_at_teardown_on_every_rank(workers, tmp_path):
    errors = workers.run(_save_an_unpicklable_entry, str(tmp_path))
    for error in errors:
        assert error is not None
        assert "checkpoint" in error
        assert "in the background failed" in error
    assert os.listdir(tmp_path) == []
