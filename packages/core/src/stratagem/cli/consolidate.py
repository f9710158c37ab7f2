"""``stratagem consolidate SRC DST``: any checkpoint (a directory of shards, say) as one plain ``torch.save`` file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stratagem.checkpoint_io import TorchCheckpointIO, read_full_checkpoint


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


def run(args: argparse.Namespace) -> int:
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
    try:
        checkpoint = read_full_checkpoint(source, io, weights_only=args.weights_only)
    except RuntimeError as error:
        print(f"stratagem consolidate: error: {error}", file=sys.stderr)
        return 1
    io.save_checkpoint(checkpoint, destination)
    print(f"wrote {destination} with entries: {', '.join(map(str, checkpoint)) or '(none)'}")
    return 0
