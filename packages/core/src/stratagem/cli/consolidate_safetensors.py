"""``stratagem consolidate SRC DST --format safetensors``: a checkpoint's weights as a Hugging Face model directory."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from stratagem.checkpoint_io import TorchCheckpointIO, read_full_checkpoint
from stratagem.checkpoint_io.safetensors_export import (
    hugging_face_weights,
    parse_size,
    write_safetensors_directory,
)
from stratagem.cli.consolidate import check_outside_source
from stratagem.cli.file_progress import footprint, format_bytes
from stratagem.printable import printable


def run(args: argparse.Namespace) -> int:
    source, destination = Path(args.source), Path(args.destination)
    check_outside_source(source, destination)
    max_shard_size = parse_size(args.max_shard_size)
    try:
        import safetensors  # noqa: F401
    except ModuleNotFoundError:
        raise ValueError("--format safetensors needs the safetensors package: pip install safetensors") from None
    files, size = footprint(source)
    print(f"reading {source} ({files} file{'' if files == 1 else 's'}, {format_bytes(size)})", flush=True)
    started = time.monotonic()
    try:
        checkpoint = read_full_checkpoint(
            source, TorchCheckpointIO(), weights_only=args.weights_only, required=["module"]
        )
        weights = hugging_face_weights(checkpoint, args.prefix)
    except RuntimeError as error:
        print(f"stratagem consolidate: error: {printable(error, 20_000, keep_newlines=True)}", file=sys.stderr)
        return 1
    print(f"read in {time.monotonic() - started:.1f} s; writing {destination}", flush=True)
    started = time.monotonic()
    written = write_safetensors_directory(weights, destination, max_shard_size, overwrite=args.overwrite)
    total = sum(path.stat().st_size for path in written)
    print(
        f"wrote {destination} ({', '.join(path.name for path in written)}; {format_bytes(total)} in "
        f"{time.monotonic() - started:.1f} s)"
    )
    return 0
