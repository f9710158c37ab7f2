"""The command-line options that become :func:`stratagem.resolve`'s (``--accelerator``, ``--devices``,
``--num-nodes``, ``--precision``), for the commands that resolve a strategy (``demo``, ``plan``), each with its
own defaults."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stratagem.connector import WiringOptions


def add_wiring_arguments(parser: argparse.ArgumentParser, *, accelerator: str, devices: str) -> None:
    """Add the options, with the command's defaults for ``--accelerator`` and ``--devices``."""
    parser.add_argument(
        "--accelerator", default=accelerator, help=f"cpu, cuda, mps, gpu or auto (default: {accelerator})"
    )
    parser.add_argument("--devices", default=devices, help=f"a count, a list such as 0,1, or auto (default: {devices})")
    parser.add_argument("--num-nodes", type=int, default=1, help="number of machines (default: 1)")
    parser.add_argument("--precision", default=None, help="32-true, bf16-mixed, 16-mixed, ... (default: 32-true)")


def wiring_options(args: argparse.Namespace) -> WiringOptions:
    """What the options say, as :func:`stratagem.resolve` takes them (``--devices`` as text, which it reads)."""
    return {
        "accelerator": args.accelerator,
        "devices": args.devices,
        "num_nodes": args.num_nodes,
        "precision": args.precision,
    }
