"""Progress of long file work in the CLI: sizes, and a file reported while it grows."""

from __future__ import annotations

import argparse
import io
import threading
import time

import torch

from stratagem.checkpoint_io import TorchCheckpointIO
from stratagem.cli import consolidate
from stratagem.cli.file_progress import GrowingFileReport, footprint, format_bytes


def test_sizes_are_written_in_binary_units():
    assert [format_bytes(value) for value in (512, 2048, 5 * 2**20, 3 * 2**30, 2**42)] == [
        "512 B",
        "2.0 KiB",
        "5.0 MiB",
        "3.0 GiB",
        "4096.0 GiB",
    ]


def test_footprint_counts_the_files_and_bytes_of_a_directory_or_a_file(tmp_path):
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "a").write_bytes(b"x" * 10)
    (tmp_path / "shards" / "nested").mkdir()
    (tmp_path / "shards" / "nested" / "b").write_bytes(b"x" * 5)
    assert footprint(tmp_path / "shards") == (2, 15)
    assert footprint(tmp_path / "shards" / "a") == (1, 10)


def test_a_growing_file_is_reported_with_its_size_and_rate_while_it_is_written(tmp_path):
    growing = tmp_path / "partial"
    stream = io.StringIO()

    def write_slowly():
        with open(growing, "wb") as file:
            for _ in range(8):
                file.write(b"x" * 2**20)
                file.flush()
                time.sleep(0.05)

    with GrowingFileReport(lambda: growing if growing.exists() else None, stream, interval=0.1):
        writer = threading.Thread(target=write_slowly)
        writer.start()
        writer.join()
    lines = stream.getvalue().splitlines()
    assert lines, "a write longer than the interval is reported"
    assert all("MiB written (" in line and "/s, " in line for line in lines)


def test_work_that_ends_within_the_first_interval_prints_nothing(tmp_path):
    stream = io.StringIO()
    with GrowingFileReport(lambda: tmp_path, stream, interval=5.0):
        pass
    assert stream.getvalue() == ""


def test_consolidate_says_what_it_reads_and_writes_with_sizes_and_times(tmp_path, capsys):
    source = tmp_path / "run.ckpt"
    TorchCheckpointIO().save_checkpoint({"module": {"weight": torch.zeros(1000)}}, source)
    parser = argparse.ArgumentParser()
    consolidate.add_arguments(parser)
    assert consolidate.run(parser.parse_args([str(source), str(tmp_path / "out.pt")])) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"reading {source} (1 file, ")
    assert lines[0].endswith("KiB)")
    assert lines[1].startswith("read in ")
    assert lines[1].endswith(f"writing {tmp_path / 'out.pt'}")
    assert lines[-1].startswith(f"wrote {tmp_path / 'out.pt'} (")
    assert lines[-1].endswith("with entries: module")


def test_consolidate_watches_the_temporary_file_that_torch_checkpoint_io_writes(tmp_path, monkeypatch):
    destination = tmp_path / "out.pt"
    watched = []
    save = torch.save

    def save_and_look(state, file, *args, **kwargs):
        save(state, file, *args, **kwargs)
        watched.append(consolidate._file_being_written(destination))

    monkeypatch.setattr(torch, "save", save_and_look)
    TorchCheckpointIO().save_checkpoint({"module": {"weight": torch.zeros(1000)}}, destination)
    [being_written] = watched
    assert being_written is not None, "the progress report would never find the file"
    assert being_written.parent == tmp_path
    assert destination.exists()
    assert not being_written.exists()
