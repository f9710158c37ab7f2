"""stratagem writes no file over another: a path the environment names is only ever created, and
``stratagem consolidate`` refuses a destination inside the checkpoint it reads or one that is not a regular file."""

from __future__ import annotations

import os
import socket

import pytest
import torch

from stratagem.cli.main import main
from stratagem.launchers.subprocess_launcher import ERROR_FILE_VARIABLE, PARENT_PID_VARIABLE, _run_as_started_rank


def _fail() -> None:
    raise RuntimeError("the rank's own error")


def test_a_rank_creates_the_error_file_its_launcher_names(tmp_path, monkeypatch):
    error_file = tmp_path / "rank-1.traceback"
    monkeypatch.delenv(PARENT_PID_VARIABLE, raising=False)
    monkeypatch.setenv(ERROR_FILE_VARIABLE, str(error_file))
    with pytest.raises(RuntimeError, match="the rank's own error"):
        _run_as_started_rank(_fail, (), {})
    assert "RuntimeError: the rank's own error" in error_file.read_text()


@pytest.mark.parametrize("existing", ["file", "link"])
def test_an_error_file_left_in_the_environment_never_replaces_an_existing_file(tmp_path, monkeypatch, capsys, existing):
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    named = precious
    if existing == "link":
        named = tmp_path / "link"
        named.symlink_to(precious)
    monkeypatch.delenv(PARENT_PID_VARIABLE, raising=False)
    monkeypatch.setenv(ERROR_FILE_VARIABLE, str(named))
    with pytest.raises(RuntimeError, match="the rank's own error"):
        _run_as_started_rank(_fail, (), {})
    assert precious.read_text() == "keep me"
    error = capsys.readouterr().err
    assert f"not writing this rank's traceback to {ERROR_FILE_VARIABLE}=" in error
    assert "Unset it" in error


@pytest.fixture
def source(tmp_path):
    """A directory standing for a sharded checkpoint (the destination is checked before anything is read)."""
    directory = tmp_path / "sharded"
    directory.mkdir()
    (directory / ".metadata").write_bytes(b"the checkpoint's metadata")
    return directory


@pytest.mark.parametrize("form", ["torch", "safetensors"])
@pytest.mark.parametrize("inside", [".metadata", "new.pt", "sub/../new.pt"])
def test_consolidate_refuses_a_destination_inside_the_checkpoint_it_reads(source, capsys, inside, form):
    assert main(["consolidate", str(source), f"{source}/{inside}", "--overwrite", "--format", form]) == 2
    assert "is inside SRC=" in capsys.readouterr().err
    assert sorted(path.name for path in source.iterdir()) == [".metadata"]
    assert (source / ".metadata").read_bytes() == b"the checkpoint's metadata"


def _plain_checkpoint(tmp_path):
    path = tmp_path / "plain.ckpt"
    torch.save({"module": {"w": torch.ones(1)}}, path)
    return path


def test_consolidate_refuses_a_named_pipe_a_socket_and_a_link_as_destination(tmp_path, capsys):
    checkpoint = _plain_checkpoint(tmp_path)
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    link = tmp_path / "link.pt"
    link.symlink_to(tmp_path / "target.pt")
    listening = socket.socket(socket.AF_UNIX)
    sock = tmp_path / "sock"
    listening.bind(str(sock))
    try:
        for destination, kind in ((pipe, "a named pipe"), (link, "a symbolic link"), (sock, "a socket")):
            assert main(["consolidate", str(checkpoint), str(destination), "--overwrite"]) == 2
            assert f"is {kind}, not a regular file" in capsys.readouterr().err
    finally:
        listening.close()
    assert pipe.is_fifo()
    assert link.is_symlink()
    assert sock.is_socket()
    assert not (tmp_path / "target.pt").exists()


def test_consolidate_still_replaces_a_regular_file_when_asked(tmp_path):
    checkpoint = _plain_checkpoint(tmp_path)
    destination = tmp_path / "out.pt"
    destination.write_bytes(b"old")
    assert main(["consolidate", str(checkpoint), str(destination)]) == 2
    assert destination.read_bytes() == b"old"
    assert main(["consolidate", str(checkpoint), str(destination), "--overwrite"]) == 0
    assert torch.equal(torch.load(destination, weights_only=True)["module"]["w"], torch.ones(1))
