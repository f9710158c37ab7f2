"""Readers open only regular files inside a checkpoint directory: links out of it, pipes, sockets,
devices, broken links and link loops are refused by name, without opening (so without blocking)."""

from __future__ import annotations

import os
import socket

import pytest
import torch

from stratagem.checkpoint_io import (
    CheckpointError,
    checkpoint_file,
    checkpoint_files,
    load_torch_file,
    optional_checkpoint_file,
)

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def checkpoint(tmp_path):
    root = tmp_path / "checkpoint"
    (root / "tag" / "zero").mkdir(parents=True)
    (root / "tag" / "shard.pt").write_bytes(b"shard")
    (root / "tag" / "zero" / "state.pt").write_bytes(b"state")
    (root / "latest").write_text("tag")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "payload.pt").write_bytes(b"payload")
    return root


def test_every_regular_file_is_listed_by_the_path_a_reader_reaches_it_through(checkpoint):
    (checkpoint / "tag" / "alias.pt").symlink_to(checkpoint / "latest")
    (checkpoint / "mirror").symlink_to(checkpoint / "tag" / "zero")
    found = {path.relative_to(checkpoint).as_posix() for path in checkpoint_files(checkpoint)}
    assert found == {"latest", "tag/shard.pt", "tag/zero/state.pt", "tag/alias.pt", "mirror/state.pt"}
    assert {path.name for path in checkpoint_files(checkpoint, "tag")} == {"shard.pt", "state.pt", "alias.pt"}


def test_a_checkpoint_path_that_is_itself_a_link_is_read_where_it_points(checkpoint, tmp_path):
    link = tmp_path / "last.ckpt"
    link.symlink_to(checkpoint)
    assert len(checkpoint_files(link)) == 3
    assert checkpoint_file(link, "latest").read_text() == "tag"


@pytest.mark.parametrize(
    "where",
    ["tag", "tag/zero", "tag/shard.pt", "latest"],
    ids=["tag folder", "nested folder", "file", "top-level file"],
)
def test_a_link_leading_outside_the_directory_is_refused_naming_it(checkpoint, tmp_path, where):
    replaced = checkpoint / where
    target = tmp_path / "outside" / ("payload.pt" if replaced.is_file() else "")
    if replaced.is_dir():
        os.rename(replaced, tmp_path / "moved")
        target = tmp_path / "moved"
    else:
        replaced.unlink()
    replaced.symlink_to(target)
    with pytest.raises(CheckpointError, match=rf"{where.split('/')[-1]}' leads outside the checkpoint"):
        checkpoint_files(checkpoint)


def test_a_file_reached_through_a_folder_linked_outside_is_refused(checkpoint, tmp_path):
    os.rename(checkpoint / "tag", tmp_path / "moved")
    (checkpoint / "tag").symlink_to(tmp_path / "moved")
    with pytest.raises(CheckpointError, match=r"shard\.pt' leads outside the checkpoint"):
        checkpoint_file(checkpoint, "tag/shard.pt")


def test_a_relative_link_climbing_out_of_the_directory_is_refused(checkpoint):
    (checkpoint / "tag" / "up.pt").symlink_to("../../outside/payload.pt")
    with pytest.raises(CheckpointError, match=r"up\.pt' leads outside"):
        checkpoint_files(checkpoint)


def test_a_pipe_is_refused_without_being_opened(checkpoint, tmp_path):
    os.mkfifo(checkpoint / "tag" / "pipe.pt")
    with pytest.raises(CheckpointError, match=r"pipe\.pt' is a named pipe"):
        checkpoint_files(checkpoint)
    with pytest.raises(CheckpointError, match=r"pipe\.pt' is a named pipe"):
        load_torch_file(checkpoint / "tag" / "pipe.pt")
    os.mkfifo(tmp_path / "alone.ckpt")
    with pytest.raises(CheckpointError, match=r"alone\.ckpt' is a named pipe"):
        load_torch_file(tmp_path / "alone.ckpt")


def test_a_socket_and_a_device_are_refused(checkpoint):
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(checkpoint / "tag" / "sock.pt"))
        with pytest.raises(CheckpointError, match=r"sock\.pt' is a socket"):
            checkpoint_files(checkpoint)
    (checkpoint / "tag" / "sock.pt").unlink()
    (checkpoint / "tag" / "null.pt").symlink_to("/dev/null")
    with pytest.raises(CheckpointError, match=r"null\.pt' leads outside"):
        checkpoint_files(checkpoint)
    with pytest.raises(CheckpointError, match=r"null' is a character device"):
        load_torch_file(os.devnull)


def test_a_broken_link_and_a_link_loop_are_refused(checkpoint):
    (checkpoint / "tag" / "gone.pt").symlink_to(checkpoint / "missing.pt")
    with pytest.raises(CheckpointError, match=r"gone\.pt' is a broken link"):
        checkpoint_files(checkpoint)
    (checkpoint / "tag" / "gone.pt").unlink()
    (checkpoint / "tag" / "zero" / "again").symlink_to(checkpoint / "tag")
    with pytest.raises(CheckpointError, match=r"again' is a link to a folder that contains it"):
        checkpoint_files(checkpoint)


def test_an_absent_optional_file_is_none_and_a_present_one_is_checked(checkpoint, tmp_path):
    assert optional_checkpoint_file(checkpoint, "plain_state.pt") is None
    (checkpoint / "plain_state.pt").symlink_to(tmp_path / "outside" / "payload.pt")
    with pytest.raises(CheckpointError, match="leads outside"):
        optional_checkpoint_file(checkpoint, "plain_state.pt")


def test_a_regular_checkpoint_file_still_loads(tmp_path):
    torch.save({"w": torch.ones(2)}, tmp_path / "ok.ckpt")
    assert torch.equal(load_torch_file(tmp_path / "ok.ckpt")["w"], torch.ones(2))
