"""Giving a finished checkpoint its name: what is left under the name, and beside it, in every case."""

from __future__ import annotations

import os
import sys

import pytest

from stratagem.checkpoint_io import atomic
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
