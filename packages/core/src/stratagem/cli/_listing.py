"""The table (or JSON) that ``stratagem strategies|accelerators|precisions|environments`` print."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from stratagem.registry import Registry

Row = dict[str, Any]
ExtraColumns = Callable[[Registry, Row], Row]


def add_listing_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print a JSON list instead of a table")


def rows_of(registry: Registry, extra: ExtraColumns | None = None) -> list[Row]:
    """One row per registered name: name, distribution, description, available here (or why not), ...

    A name two distributions claim is listed once, unavailable, with the conflict as its reason.
    """
    rows = []
    for name in registry.names():
        try:
            row = registry.describe(name).as_dict()
        except ValueError as error:
            row = {"name": name, "description": "", "distribution": "(conflict)", "available": False}
            row["reason"] = str(error)
        if extra is not None:
            row.update(extra(registry, row))
        rows.append(row)
    return rows


def print_listing(
    registry: Registry,
    args: argparse.Namespace,
    extra: ExtraColumns | None = None,
    extra_headers: Sequence[str] = (),
    out: TextIO | None = None,
) -> int:
    """Print every name of ``registry`` as a table, or as JSON with ``--json``; return the exit status.

    ``extra`` adds keys to each row; ``extra_headers`` names those shown as table columns.
    """
    out = out or sys.stdout
    rows = rows_of(registry, extra)
    if args.json:
        json.dump(rows, out, indent=2)
        out.write("\n")
    else:
        headers = ["name", "distribution", "available", *extra_headers, "description"]
        cells = [[_cell(row, header) for header in headers] for row in rows]
        out.write(format_table([header.upper() for header in headers], cells))
        for row in rows:
            if not row["available"]:
                out.write(f"\n{row['name']}: not available here: {row['reason']}")
        if any(not row["available"] for row in rows):
            out.write("\n")
    problems = registry.problems()
    if problems:
        print(
            f"{len(problems)} plugin problem(s) in {registry.group}; `stratagem doctor` shows them.",
            file=sys.stderr,
        )
    return 0


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns two spaces apart; the last column is not padded."""
    widths = [max(len(str(line[column])) for line in [headers, *rows]) for column in range(len(headers))]
    lines = []
    for line in [headers, *rows]:
        padded = [str(cell).ljust(width) for cell, width in zip(line[:-1], widths[:-1])]
        lines.append("  ".join([*padded, str(line[-1])]).rstrip())
    return "\n".join(lines) + "\n"


def _cell(row: Row, header: str) -> str:
    value = row.get(header)
    if isinstance(value, bool):
        return "yes" if value else "no"
    return "" if value is None else str(value)
