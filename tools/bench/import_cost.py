"""Import cost: `python -c "import stratagem"` against `python -c "import torch"`, in fresh processes.

Each statement runs in a new interpreter, interleaved with the others (and in a rotating
order) so that a busy machine slows them alike; the median of the wall times is compared.
Target: ``import stratagem`` costs at most 1.05x ``import torch``. ``import stratagem.connector``
(interfaces, registries and torch: what ``stratagem.resolve`` needs) is shown for context.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

REFERENCE = "import torch"
MEASURED = "import stratagem"
CONTEXT = ("import stratagem.connector",)


def time_statement(python: str, statement: str) -> float:
    """Wall time of one fresh interpreter running ``statement``, in seconds."""
    start = time.perf_counter()
    subprocess.run([python, "-c", statement], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def measure(python: str, statements: list[str], runs: int) -> dict[str, list[float]]:
    """``runs`` timings per statement, interleaved round by round, rotating who goes first."""
    timings: dict[str, list[float]] = {statement: [] for statement in statements}
    for round_index in range(runs):
        shift = round_index % len(statements)
        for statement in statements[shift:] + statements[:shift]:
            timings[statement].append(time_statement(python, statement))
    return timings


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="run.py import", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=11, help="fresh processes per statement (at least 10)")
    parser.add_argument("--target", type=float, default=1.05, help="highest acceptable ratio (default 1.05)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter to measure (default: this one)")
    parser.add_argument("--check", action="store_true", help="exit 1 when the ratio is above the target")
    args = parser.parse_args(argv)
    if args.runs < 10:
        parser.error(f"--runs={args.runs} is too few for a stable median; use at least 10.")

    statements = [REFERENCE, MEASURED, *CONTEXT]
    for statement in statements:  # warm the file cache so the first round is not the outlier
        time_statement(args.python, statement)
    timings = measure(args.python, statements, args.runs)
    medians = {statement: statistics.median(values) for statement, values in timings.items()}

    width = max(map(len, statements))
    print(f"{'statement'.ljust(width)}  median s  min s   max s   x torch   ({args.runs} runs each, interleaved)")
    for statement in statements:
        values = timings[statement]
        ratio = medians[statement] / medians[REFERENCE]
        print(
            f"{statement.ljust(width)}  {medians[statement]:8.3f}  {min(values):6.3f}  {max(values):6.3f}  {ratio:7.3f}"
        )
    ratio = medians[MEASURED] / medians[REFERENCE]
    verdict = "within" if ratio <= args.target else "ABOVE"
    print(f"\nimport cost ratio (stratagem / torch): {ratio:.3f} - {verdict} the target of {args.target:.2f}")
    return 1 if args.check and ratio > args.target else 0
