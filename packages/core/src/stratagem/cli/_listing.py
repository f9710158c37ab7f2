"""The table (or JSON) that ``stratagem strategies|accelerators|precisions|environments`` print.

A plain listing reads what plugins registered and imports no target (nor torch): whether a name
is usable here is only known from what it declares it needs (a distribution, a module). ``--check``
imports each target and asks it, which is what the AVAILABLE column then shows.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from stratagem.printable import printable
from stratagem.registry import Registry
from stratagem.registry.registry import json_defaults

Row = dict[str, Any]
ExtraColumns = Callable[[Registry, Row], Row]


def add_listing_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    parser.add_argument(
        "--check",
        action="store_true",
        help="import each one (torch and every backend included) and check that it is usable here",
    )


def rows_of(registry: Registry, check: bool, extra: ExtraColumns | None = None) -> list[Row]:
    """One row per registered name: name, distribution, description, available here (or why not), ...

    Without ``check``, ``available`` is ``False`` for a missing requirement and ``None`` (not
    checked) otherwise, and ``extra`` is not called. A name two distributions claim is listed
    once, unavailable, with the conflict as its reason.
    """
    rows = []
    for name in registry.names():
        try:
            row = registry.describe(name).as_dict() if check else _unchecked_row(registry, name)
        except ValueError as error:
            row = {"name": name, "description": "", "distribution": "(conflict)", "available": False}
            row["reason"] = str(error)
        if check and extra is not None:
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

    ``extra`` adds keys to each row with ``--check``; ``extra_headers`` names those shown as
    table columns ("?" without ``--check``).
    """
    out = out or sys.stdout
    rows = rows_of(registry, args.check, extra)
    if args.json:
        json.dump(rows, out, indent=2)
        out.write("\n")
    else:
        headers = ["name", "distribution", "available", *extra_headers, "description"]
        cells = [[_cell(row, header) for header in headers] for row in rows]
        out.write(format_table([header.upper() for header in headers], cells))
        unavailable = [row for row in rows if row["available"] is False]
        for row in unavailable:
            out.write(f"\n{printable(row['name'])}: not available here: {printable(row['reason'], 2000)}")
        if unavailable:
            out.write("\n")
        if not args.check:
            out.write(
                f"\n? = not checked: this listing imported no {registry.kind} (nor torch). "
                "Run with --check to import and check each one.\n"
            )
    print_problems(registry)
    return 0


def print_problems(registry: Registry) -> None:
    """Each plugin problem of ``registry``, one line each, on stderr."""
    problems = registry.problems()
    if problems:
        print(
            f"{len(problems)} plugin problem(s) in {registry.group}; `stratagem doctor` shows them.",
            file=sys.stderr,
        )
    for problem in problems:
        print(
            f"  {printable(problem.distribution)} ({printable(problem.entry_point)}): {printable(problem.error, 2000)}",
            file=sys.stderr,
        )


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns two spaces apart; the last column is not padded. Cells come from plugins'
    metadata: their control characters are escaped."""
    shown = [[printable(cell, 1000) for cell in line] for line in [headers, *rows]]
    widths = [max(len(line[column]) for line in shown) for column in range(len(headers))]
    lines = []
    for line in shown:
        padded = [cell.ljust(width) for cell, width in zip(line[:-1], widths[:-1])]
        lines.append("  ".join([*padded, line[-1]]).rstrip())
    return "\n".join(lines) + "\n"


def _unchecked_row(registry: Registry, name: str) -> Row:
    registration = registry.get(name)
    reason = registration.missing_requirement()
    return {
        "name": name,
        "description": registration.description,
        "distribution": registration.distribution,
        "requires": registration.requires,
        "available": False if reason is not None else None,
        "reason": reason,
        "defaults": json_defaults(registration.defaults),
        "target": registration.target_path,
    }


def _cell(row: Row, header: str) -> str:
    value = row.get(header, None)
    if isinstance(value, bool):
        return "yes" if value else "no"
    return "?" if value is None else str(value)
