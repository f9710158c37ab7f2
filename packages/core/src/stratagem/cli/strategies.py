"""``stratagem strategies``: every registered strategy, its distribution, and whether it is usable here."""

from __future__ import annotations

import argparse

from stratagem import registry
from stratagem.cli._listing import add_listing_arguments, print_listing


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_listing_arguments(parser)


def run(args: argparse.Namespace) -> int:
    return print_listing(registry.strategies, args)
