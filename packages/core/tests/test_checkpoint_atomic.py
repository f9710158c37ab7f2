"""Giving a finished checkpoint its name: what is left under the name, and beside it, in every case."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from stratagem.checkpoint_io import TorchCheckpointIO, atomic
from stratagem.checkpoint_io.atomic import move_into_place, temporary_sibling


def _directory(path, **files):
    path.mkdir()
    for name, text in files.items():
        (path / name).write_text(text)
    return path


def _listing(directory):
    return sorted(os.listdir(directory))


def test_names_can_be_swapped_in_one_step_on_linux(tmp_path):
    if not sys.platform.startswith("linux"):
        pytest.skip("renameat2(RENAME_EXCHANGE) is Linux's")
    first, second = _directory(tmp_path / "a", x="1"), _directory(tmp_path / "b", y="2")
    assert atomic._exchange(first, second) is True
    assert (_listing(first), _listing(second)) == (["y"], ["x"])


def test_a_directory_checkpoint_replaces_another_with_its_name_never_missing(tmp_path, monkeypatch):
    target = _directory(tmp_path / "last.ckpt", old="old")
    finished = _directory(temporary_sibling(target), new="new")
    swaps = []
    real_exchange = atomic._exchange

    def exchange(first, second):
        swapped = real_exchange(first, second)
        swaps.append(swapped)
        assert target.exists(), "the name is never missing"
        return swapped

    monkeypatch.setattr(atomic, "_exchange", exchange)
    move_into_place(finished, target)
    assert swaps == [sys.platform.startswith("linux")]
    assert (target / "new").read_text() == "new"
    assert _listing(tmp_path) == ["last.ckpt"]


def test_where_names_cannot_be_swapped_the_previous_checkpoint_is_renamed_aside_and_deleted(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic, "_exchange", lambda first, second: False)
    target = _directory(tmp_path / "last.ckpt", old="old")
    move_into_place(_directory(temporary_sibling(target), new="new"), target)
    assert _listing(target) == ["new"]
    assert _listing(tmp_path) == ["last.ckpt"]


@pytest.mark.parametrize("swappable", [True, False])
def test_a_directory_replaces_a_link_to_a_checkpoint_and_leaves_what_it_pointed_to(tmp_path, monkeypatch, swappable):
    if not swappable:
        monkeypatch.setattr(atomic, "_exchange", lambda first, second: False)
    pointed_to = _directory(tmp_path / "epoch=3.ckpt", weights="3")
    target = tmp_path / "last.ckpt"
    target.symlink_to(pointed_to.name)
    move_into_place(_directory(temporary_sibling(target), weights="4"), target)
    assert not target.is_symlink()
    assert (target / "weights").read_text() == "4"
    assert (pointed_to / "weights").read_text() == "3"
    assert _listing(tmp_path) == ["epoch=3.ckpt", "last.ckpt"]


def test_a_file_replaces_a_directory_checkpoint(tmp_path):
    target = _directory(tmp_path / "last.ckpt", old="old")
    finished = temporary_sibling(target)
    finished.write_text("file")
    move_into_place(finished, target)
    assert target.read_text() == "file"
    assert _listing(tmp_path) == ["last.ckpt"]


def _dead_pid():
    """The pid of a process of this host that has exited."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def _age(path, seconds):
    then = time.time() - seconds
    for entry in [path, *path.rglob("*")] if path.is_dir() else [path]:
        os.utime(entry, (then, then), follow_symlinks=False)
    return path


def _left_by(target, pid, host=None):
    """A temporary of ``target`` as the process ``pid`` (of ``host``, default this host) would have named it."""
    name = temporary_sibling(target).name
    prefix, _, rest = name.rpartition(".tmp-")
    _, _, token = rest.split("-")
    return target.parent / f"{prefix}.tmp-{host or atomic._host_tag()}-{pid}-{token}"


def test_a_temporary_names_its_writer_and_is_found_as_a_write_in_progress(tmp_path):
    target = tmp_path / "last.ckpt"
    temporary = temporary_sibling(target)
    assert temporary.name.startswith(".last.ckpt.tmp-")
    assert f"-{os.getpid()}-" in temporary.name
    temporary.write_bytes(b"partial")
    assert atomic.temporary_siblings(target) == [temporary]


def test_what_a_dead_writer_left_is_removed_and_nothing_else(tmp_path):
    target = tmp_path / "epoch=0-step=2.ckpt"
    dead = _left_by(target, _dead_pid())
    dead.write_bytes(b"x" * 100)
    _age(dead, 120)
    dead_directory = _left_by(tmp_path / "last.ckpt", _dead_pid())
    (dead_directory / "shards").mkdir(parents=True)
    (dead_directory / "shards" / "0.pt").write_bytes(b"x")
    _age(dead_directory, 120)
    just_died = _left_by(target, _dead_pid())
    just_died.write_bytes(b"x")  # its writer may be a process of another pid namespace: wait a minute
    alive = _left_by(target, os.getpid())
    alive.write_bytes(b"x")
    _age(alive, 3600)
    other_host = _left_by(target, _dead_pid(), host="00000000")
    other_host.write_bytes(b"x")
    _age(other_host, 3600)
    not_ours = [tmp_path / ".epoch=0-step=2.ckpt.tmp-mine", tmp_path / ".hidden", tmp_path / "epoch=0-step=1.ckpt"]
    for path in not_ours:
        path.write_bytes(b"x")
        _age(path, atomic.UNKNOWN_WRITER_SECONDS + 60)
    assert sorted(atomic.remove_stale_temporaries(tmp_path)) == sorted([dead, dead_directory])
    assert sorted(tmp_path.iterdir()) == sorted([just_died, alive, other_host, *not_ours])


def test_a_temporary_untouched_for_a_day_is_removed_whoever_wrote_it(tmp_path):
    target = tmp_path / "last.ckpt"
    other_host = _left_by(target, 1, host="00000000")
    older_naming = tmp_path / ".last.ckpt.tmp-0123456789ab"
    for path in (other_host, older_naming):
        path.write_bytes(b"x")
        _age(path, atomic.UNKNOWN_WRITER_SECONDS + 60)
    assert sorted(atomic.remove_stale_temporaries(tmp_path)) == sorted([other_host, older_naming])
    assert atomic.remove_stale_temporaries(tmp_path / "missing") == []


def test_a_file_save_removes_what_a_crashed_save_left_beside_it(tmp_path):
    target = tmp_path / "last.ckpt"
    crashed = _left_by(target, _dead_pid())
    crashed.write_bytes(b"x" * 1000)
    _age(crashed, 120)
    TorchCheckpointIO().save_checkpoint({"step": 2}, target)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["last.ckpt"]
