"""``stratagem environments``: every cluster environment, whether it is detected here, and which one is used."""

from __future__ import annotations

import argparse
from typing import Any

from stratagem import registry
from stratagem.cli._listing import Row, add_listing_arguments, print_listing
from stratagem.registry import Registry


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_listing_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from stratagem.connector import detect_environment

    selected = type(detect_environment())

    def detection(environments: Registry, row: Row) -> dict[str, Any]:
        if not row["available"]:
            return {"detected": False, "selected": False}
        environment_class = environments.load_target(row["name"])
        return {"detected": bool(environment_class.detect()), "selected": environment_class is selected}

    return print_listing(registry.environments, args, extra=detection, extra_headers=("detected", "selected"))
