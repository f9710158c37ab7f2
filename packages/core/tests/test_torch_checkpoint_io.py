import errno
import os
import pickle

import pytest
import torch

from stratagem.checkpoint_io import CheckpointError, TorchCheckpointIO, read_full_checkpoint


def test_save_writes_atomically_and_leaves_no_temporary_files(tmp_path):
    io = TorchCheckpointIO()
    target = tmp_path / "nested" / "model.ckpt"
    io.save_checkpoint({"weight": torch.ones(3)}, target)
    io.save_checkpoint({"weight": torch.zeros(3)}, target)
    assert os.listdir(target.parent) == ["model.ckpt"]
    assert torch.equal(io.load_checkpoint(target)["weight"], torch.zeros(3))


def test_a_failing_save_keeps_the_previous_checkpoint_and_removes_the_partial_file(tmp_path):
    io = TorchCheckpointIO()
    target = tmp_path / "model.ckpt"
    io.save_checkpoint({"weight": torch.ones(2)}, target)

    class Unpicklable:
        def __reduce__(self):
            raise pickle.PicklingError("refuses to be saved")

    with pytest.raises(pickle.PicklingError):
        io.save_checkpoint({"weight": torch.zeros(2), "bad": Unpicklable()}, target)
    assert os.listdir(tmp_path) == ["model.ckpt"]
    assert torch.equal(io.load_checkpoint(target)["weight"], torch.ones(2))


class _Custom:
    pass


class _DiskFillsAfter:
    """A file that takes ``capacity`` bytes and then fails as a full disk does."""

    def __init__(self, path, capacity):
        self._file = open(path, "wb")  # noqa: SIM115 - closed by __exit__, as open()'s own file is
        self._left = capacity

    def write(self, data):
        if len(data) > self._left:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._left -= len(data)
        return self._file.write(data)

    def __getattr__(self, name):
        return getattr(self._file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self._file.close()


def test_a_full_disk_is_an_oserror_naming_the_checkpoint_and_no_space_and_keeps_the_previous(tmp_path, monkeypatch):
    from stratagem.checkpoint_io import torch_io

    target = tmp_path / "model.ckpt"
    io = TorchCheckpointIO()
    io.save_checkpoint({"module": {"w": torch.ones(4)}}, target)
    monkeypatch.setattr(torch_io, "open", lambda path, mode: _DiskFillsAfter(path, 1024), raising=False)
    with pytest.raises(
        OSError, match=r"Writing the checkpoint '.*model\.ckpt' failed: No space left on device"
    ) as raised:
        io.save_checkpoint({"module": {"w": torch.zeros(100_000)}}, target)
    assert raised.value.errno == errno.ENOSPC
    assert "unexpected pos" not in str(raised.value)
    assert torch.equal(io.load_checkpoint(target)["module"]["w"], torch.ones(4))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model.ckpt"]


def test_a_file_checkpoint_takes_the_place_of_a_directory_checkpoint_and_a_link_without_following_it(tmp_path):
    io = TorchCheckpointIO()
    directory_checkpoint = tmp_path / "last.ckpt"
    directory_checkpoint.mkdir()
    (directory_checkpoint / "shard.pt").write_bytes(b"old")
    io.save_checkpoint({"step": 1}, directory_checkpoint)
    assert io.load_checkpoint(directory_checkpoint) == {"step": 1}
    linked = tmp_path / "linked.ckpt"
    io.save_checkpoint({"step": 2}, linked)
    link = tmp_path / "link.ckpt"
    link.symlink_to(linked.name)
    io.save_checkpoint({"step": 3}, link)
    assert not link.is_symlink()
    assert io.load_checkpoint(linked) == {"step": 2}
    assert sorted(path.name for path in tmp_path.iterdir()) == ["last.ckpt", "link.ckpt", "linked.ckpt"]


def test_load_is_weights_only_by_default_with_an_explanation_and_an_opt_out(tmp_path):
    target = tmp_path / "pickle.ckpt"
    torch.save({"obj": _Custom()}, target)
    io = TorchCheckpointIO()
    with pytest.raises(CheckpointError, match="weights_only=False"):
        io.load_checkpoint(target)
    assert isinstance(io.load_checkpoint(target, weights_only=False)["obj"], _Custom)


def test_missing_checkpoint_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        read_full_checkpoint(tmp_path / "nothing-here", TorchCheckpointIO())


def test_an_unrecognised_directory_says_which_readers_were_asked(tmp_path):
    with pytest.raises(ValueError, match="No installed checkpoint IO recognises"):
        read_full_checkpoint(tmp_path, TorchCheckpointIO())


def test_every_checkpoint_io_removes_a_file_or_a_directory_and_ignores_a_missing_one(tmp_path):
    from stratagem.checkpoint_io import CheckpointIO

    class WritesNothingOfItsOwn(CheckpointIO):
        def save_checkpoint(self, checkpoint, path):
            raise NotImplementedError

        def load_checkpoint(self, path, map_location="cpu", weights_only=True):
            raise NotImplementedError

    file, directory = tmp_path / "model.ckpt", tmp_path / "shards"
    file.write_bytes(b"x")
    (directory / "inner").mkdir(parents=True)
    (directory / "inner" / "0.distcp").write_bytes(b"x")
    for io in (WritesNothingOfItsOwn(), TorchCheckpointIO()):
        io.remove_checkpoint(file)
        io.remove_checkpoint(directory)
        io.remove_checkpoint(tmp_path / "never-written")
        assert not file.exists()
        assert not directory.exists()
        file.write_bytes(b"x")
        (directory / "inner").mkdir(parents=True)
