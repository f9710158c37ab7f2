"""``stratagem environments``: every cluster environment, whether it is detected here, and which one is used."""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any

from stratagem import registry
from stratagem.cli._listing import Row, add_listing_arguments, print_listing
from stratagem.printable import printable
from stratagem.registry import PluginError, Registry


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_listing_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if not args.check:
        return print_listing(registry.environments, args, extra_headers=("detected", "selected"))
    from stratagem.connector import detect_environment

    selected: type | None = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the plugin problems are listed below the table
        try:
            selected = type(detect_environment())
        except (ValueError, TypeError) as error:  # e.g. a scheduler variable that is not a number
            print(f"which environment a run would use could not be decided: {printable(error, 2000)}", file=sys.stderr)

    def detection(environments: Registry, row: Row) -> dict[str, Any]:
        if not row["available"]:
            return {"detected": False, "selected": False}
        name = row["name"]
        try:
            environment_class = environments.load_target(name)
            detected = bool(environments.call_plugin(name, "detect()", environment_class.detect))
        except PluginError as error:
            return {"available": False, "reason": error.problem.error, "detected": None, "selected": False}
        return {"detected": detected, "selected": environment_class is selected}

    return print_listing(registry.environments, args, extra=detection, extra_headers=("detected", "selected"))
