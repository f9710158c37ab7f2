"""``stratagem consolidate SRC DST``: any checkpoint (a directory of shards, say) as one plain ``torch.save`` file,
or with ``--format safetensors`` its weights as a Hugging Face model directory."""

from __future__ import annotations

import argparse
import stat
import sys
import time
from pathlib import Path

from stratagem.checkpoint_io import TorchCheckpointIO, read_full_checkpoint, temporary_siblings
from stratagem.cli.file_progress import GrowingFileReport, footprint, format_bytes
from stratagem.printable import printable


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "source",
        metavar="SRC",
        help="a checkpoint written by any installed strategy: a directory of shards or a file",
    )
    parser.add_argument(
        "destination", metavar="DST", help="the file to write (written to a temporary name, then renamed)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace DST if it exists")
    parser.add_argument(
        "--no-weights-only",
        dest="weights_only",
        action="store_false",
        help="allow arbitrary pickled objects in SRC (only for checkpoints you trust)",
    )
    parser.add_argument(
        "--format",
        choices=("torch", "safetensors"),
        default="torch",
        help="torch: DST is one torch.save file of the whole checkpoint; safetensors: DST is a directory of the "
        "module weights that transformers' from_pretrained reads (other files there, such as config.json, are kept)",
    )
    parser.add_argument(
        "--max-shard-size",
        default="5GB",
        help="with --format safetensors: the largest file before the weights are split over several with an "
        "index (default: 5GB)",
    )
    parser.add_argument(
        "--prefix",
        default=None,
        help="with --format safetensors: what to strip from the module's keys to get the Hugging Face model's "
        "(e.g. 'model.' for a Module holding it as self.model; only keys with it are written); default: the "
        "Module's one attribute when all weights sit under it; '' keeps keys whole",
    )


def run(args: argparse.Namespace) -> int:
    if args.format == "safetensors":
        from stratagem.cli import consolidate_safetensors

        return consolidate_safetensors.run(args)
    source, destination = Path(args.source), Path(args.destination)
    check_destination(source, destination, overwrite=args.overwrite)
    io = TorchCheckpointIO()
    files, size = footprint(source)
    print(
        f"reading {printable(source, 1000)} ({files} file{'' if files == 1 else 's'}, {format_bytes(size)})", flush=True
    )
    started = time.monotonic()
    try:
        # dict(): consolidation writes every entry, so deferred ones are read here, where their errors are caught.
        checkpoint = dict(read_full_checkpoint(source, io, weights_only=args.weights_only))
    except RuntimeError as error:
        print(f"stratagem consolidate: error: {printable(error, 20_000, keep_newlines=True)}", file=sys.stderr)
        return 1
    print(f"read in {time.monotonic() - started:.1f} s; writing {printable(destination, 1000)}", flush=True)
    started = time.monotonic()
    with GrowingFileReport(lambda: _file_being_written(destination), sys.stdout):
        io.save_checkpoint(checkpoint, destination)
    print(
        f"wrote {printable(destination, 1000)} ({format_bytes(destination.stat().st_size)} in "
        f"{time.monotonic() - started:.1f} s) "
        f"with entries: {printable(', '.join(map(str, checkpoint)), 1000) or '(none)'}"
    )
    return 0


def check_destination(source: Path, destination: Path, overwrite: bool) -> None:
    """Refuse a ``destination`` whose writing could destroy something: one inside ``source`` (the checkpoint
    being read), one that is not a regular file (a device, a pipe, a link, a directory), or, without
    ``overwrite``, one that exists."""
    check_outside_source(source, destination)
    shown = f"DST={printable(repr(str(destination)))}"
    try:
        mode = destination.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        raise ValueError(
            f"{shown} is {_kind(mode)}, not a regular file; consolidate writes a new file under that name and would "
            "replace it. Give the path of a regular file or of one that does not exist yet."
        )
    if not overwrite:
        raise ValueError(f"{shown} exists; pass --overwrite to replace it.")


def check_outside_source(source: Path, destination: Path) -> None:
    """Refuse a ``source`` that does not exist, and a ``destination`` that is ``source`` or lies inside it."""
    if not source.exists():
        raise ValueError(f"SRC={printable(repr(str(source)))} does not exist; give a checkpoint directory or file.")
    resolved_source, resolved_destination = source.resolve(), destination.resolve()
    if resolved_destination == resolved_source:
        raise ValueError("DST is SRC; write the consolidated checkpoint to another path.")
    if resolved_source in resolved_destination.parents:
        raise ValueError(
            f"DST={printable(repr(str(destination)))} is inside SRC={printable(repr(str(source)))}, the checkpoint "
            "being read; writing there would change or destroy it. Write outside SRC."
        )


def _kind(mode: int) -> str:
    kinds = [
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISSOCK, "a socket"),
    ]
    return next((name for test, name in kinds if test(mode)), "a special file")


def _file_being_written(destination: Path) -> Path | None:
    # TorchCheckpointIO writes under a temporary sibling name and renames it when complete.
    return next(iter(temporary_siblings(destination)), None)
