"""``stratagem consolidate SRC DST``: any checkpoint (a directory of shards, say) as one plain ``torch.save`` file,
or with ``--format safetensors`` its weights as a Hugging Face model directory."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from stratagem.checkpoint_io import TorchCheckpointIO, read_full_checkpoint, temporary_siblings
from stratagem.cli.file_progress import GrowingFileReport, footprint, format_bytes


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
    if not source.exists():
        raise ValueError(f"SRC={str(source)!r} does not exist; give a checkpoint directory or file.")
    if destination.is_dir():
        raise ValueError(f"DST={str(destination)!r} is a directory; give the path of the file to write.")
    if destination.exists() and not args.overwrite:
        raise ValueError(f"DST={str(destination)!r} exists; pass --overwrite to replace it.")
    if destination.resolve() == source.resolve():
        raise ValueError("DST is SRC; write the consolidated checkpoint to another path.")
    io = TorchCheckpointIO()
    files, size = footprint(source)
    print(f"reading {source} ({files} file{'' if files == 1 else 's'}, {format_bytes(size)})", flush=True)
    started = time.monotonic()
    try:
        # dict(): consolidation writes every entry, so deferred ones are read here, where their errors are caught.
        checkpoint = dict(read_full_checkpoint(source, io, weights_only=args.weights_only))
    except RuntimeError as error:
        print(f"stratagem consolidate: error: {error}", file=sys.stderr)
        return 1
    print(f"read in {time.monotonic() - started:.1f} s; writing {destination}", flush=True)
    started = time.monotonic()
    with GrowingFileReport(lambda: _file_being_written(destination), sys.stdout):
        io.save_checkpoint(checkpoint, destination)
    print(
        f"wrote {destination} ({format_bytes(destination.stat().st_size)} in {time.monotonic() - started:.1f} s) "
        f"with entries: {', '.join(map(str, checkpoint)) or '(none)'}"
    )
    return 0


def _file_being_written(destination: Path) -> Path | None:
    # TorchCheckpointIO writes under a temporary sibling name and renames it when complete.
    return next(iter(temporary_siblings(destination)), None)
