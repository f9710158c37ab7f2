import errno
import os
import pickle
import threading

import pytest
import torch
from trainer_testing import ClassifierModule, make_loader, quiet_trainer

from stratagem import registry
from stratagem.callbacks import ModelCheckpoint
from stratagem.checkpoint_io import CheckpointIO, TorchCheckpointIO
from stratagem.checkpoint_io.async_io import AsyncCheckpointIO


class _GatedIO(TorchCheckpointIO):
    """Writes only once the test opens the gate, and records the thread that wrote."""

    def __init__(self):
        self.gate = threading.Event()
        self.threads = []

    def save_checkpoint(self, checkpoint, path):
        self.gate.wait(timeout=30)
        self.threads.append(threading.current_thread().name)
        super().save_checkpoint(checkpoint, path)


class _FailingIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint, path):
        raise OSError("disk full")


def test_save_returns_before_the_write_and_saves_the_values_of_the_moment_it_was_called(tmp_path):
    inner = _GatedIO()
    io = AsyncCheckpointIO(inner)
    weight = torch.zeros(3)
    io.save_checkpoint({"weight": weight, "nested": [weight]}, tmp_path / "a.ckpt")
    assert not (tmp_path / "a.ckpt").exists()
    weight.add_(1)  # training goes on changing the live tensor
    inner.gate.set()
    io.teardown()
    saved = torch.load(tmp_path / "a.ckpt", weights_only=True)
    assert torch.equal(saved["weight"], torch.zeros(3))
    assert torch.equal(saved["nested"][0], torch.zeros(3))
    assert inner.threads[0].startswith("stratagem-checkpoint")


def test_writes_and_removals_happen_in_order_and_loading_waits_for_them(tmp_path):
    io = AsyncCheckpointIO()
    io.save_checkpoint({"step": 1}, tmp_path / "a.ckpt")
    io.save_checkpoint({"step": 2}, tmp_path / "b.ckpt")
    io.remove_checkpoint(tmp_path / "a.ckpt")
    assert io.load_checkpoint(tmp_path / "b.ckpt") == {"step": 2}
    assert not (tmp_path / "a.ckpt").exists()
    io.teardown()


def test_an_error_in_the_background_surfaces_at_the_next_call_and_at_teardown(tmp_path):
    io = AsyncCheckpointIO(_FailingIO())
    io.save_checkpoint({"step": 1}, tmp_path / "a.ckpt")
    with pytest.raises(RuntimeError, match="background checkpoint write failed: disk full"):
        io.teardown()
    io = AsyncCheckpointIO(_FailingIO())
    io.save_checkpoint({"step": 1}, tmp_path / "a.ckpt")
    io._pending[0].exception(timeout=30)  # let the background write fail before the next call
    with pytest.raises(RuntimeError, match="disk full"):
        io.save_checkpoint({"step": 2}, tmp_path / "b.ckpt")


class _DiskFullAfter(TorchCheckpointIO):
    """Writes through torch.save, which fails with ENOSPC (as on a full disk) after ``writes`` successful writes."""

    def __init__(self, writes):
        self.writes = writes

    def save_checkpoint(self, checkpoint, path):
        original = torch.save

        def save(*args, **kwargs):
            if self.writes == 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self.writes -= 1
            return original(*args, **kwargs)

        torch.save = save
        try:
            super().save_checkpoint(checkpoint, path)
        finally:
            torch.save = original


def test_a_removal_queued_behind_a_failed_write_does_not_run(tmp_path):
    io = AsyncCheckpointIO(_DiskFullAfter(writes=1))
    io.save_checkpoint({"step": 1}, tmp_path / "a.ckpt")
    io.save_checkpoint({"step": 2}, tmp_path / "b.ckpt")
    io.remove_checkpoint(tmp_path / "a.ckpt")
    with pytest.raises(RuntimeError, match=r"background checkpoint write failed: .*No space left on device"):
        io.teardown()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a.ckpt"]
    assert torch.load(tmp_path / "a.ckpt", weights_only=True) == {"step": 1}


def test_a_disk_full_during_top_k_rotation_keeps_the_previous_checkpoint_and_fails_the_fit(tmp_path):
    callback = ModelCheckpoint(every_n_train_steps=2, save_top_k=1, dirpath=tmp_path / "ckpts")
    trainer = quiet_trainer(
        tmp_path,
        max_steps=6,
        enable_checkpointing=True,
        callbacks=[callback],
        plugins=AsyncCheckpointIO(_DiskFullAfter(writes=1)),
    )
    with pytest.raises(RuntimeError, match="No space left on device"):
        trainer.fit(ClassifierModule(), make_loader())
    assert sorted(path.name for path in (tmp_path / "ckpts").iterdir()) == ["epoch=0-step=2.ckpt"]
    assert torch.load(tmp_path / "ckpts" / "epoch=0-step=2.ckpt", weights_only=True)["loops"]["fit"]["global_step"] == 2


def test_async_is_registered_and_a_fit_waits_for_its_writes_at_the_end(tmp_path):
    assert isinstance(registry.checkpoint_io.create("async"), AsyncCheckpointIO)
    callback = ModelCheckpoint(every_n_train_steps=2, save_last=True)
    trainer = quiet_trainer(tmp_path, max_steps=6, enable_checkpointing=True, callbacks=[callback], plugins="async")
    assert isinstance(trainer.strategy.checkpoint_io, AsyncCheckpointIO)
    trainer.fit(ClassifierModule(), make_loader())
    last = torch.load(tmp_path / "checkpoints" / "version_0" / "last.ckpt", weights_only=True)
    assert last["loops"]["fit"]["global_step"] == 6
    assert sorted(path.name for path in (tmp_path / "checkpoints" / "version_0").iterdir()) == [
        "epoch=0-step=6.ckpt",
        "last.ckpt",
    ]


def test_a_failed_background_write_fails_the_fit(tmp_path):
    trainer = quiet_trainer(
        tmp_path,
        max_steps=2,
        enable_checkpointing=True,
        plugins=AsyncCheckpointIO(_FailingIO()),
    )
    with pytest.raises(RuntimeError, match="disk full"):
        trainer.fit(ClassifierModule(), make_loader())


def test_a_save_after_the_run_is_written_when_it_returns_and_raises_what_the_write_raised(tmp_path):
    trainer = quiet_trainer(tmp_path, max_steps=2, plugins="async")
    module = ClassifierModule()
    trainer.fit(module, make_loader())
    trainer.save_checkpoint(tmp_path / "after.ckpt")
    saved = torch.load(tmp_path / "after.ckpt", weights_only=True)
    assert torch.equal(saved["module"]["layers.0.weight"], module.layers[0].weight)
    failing = quiet_trainer(tmp_path, max_steps=2, plugins=AsyncCheckpointIO(_FailingIO()))
    failing.fit(ClassifierModule(), make_loader())
    with pytest.raises(RuntimeError, match="disk full"):
        failing.save_checkpoint(tmp_path / "failed.ckpt")
    assert not (tmp_path / "failed.ckpt").exists()


def test_it_pickles_without_its_thread_for_spawned_workers(tmp_path):
    io = AsyncCheckpointIO()
    io.save_checkpoint({"step": 1}, tmp_path / "a.ckpt")
    clone = pickle.loads(pickle.dumps(io))
    io.teardown()
    assert isinstance(clone, CheckpointIO)
    assert clone._executor is None
    assert clone.load_checkpoint(tmp_path / "a.ckpt") == {"step": 1}


def test_wrapping_an_io_that_every_rank_calls_together_is_refused():
    class Collective(TorchCheckpointIO):
        writes_collectively = True

    with pytest.raises(
        ValueError, match=r"AsyncCheckpointIO\(checkpoint_io=Collective\(\)\) is not valid: .*every rank"
    ):
        AsyncCheckpointIO(Collective())
