"""Run one of stratagem's benchmarks by name: ``python tools/bench/run.py <name> [options]``.

A benchmark is a module ``tools/bench/<name>.py`` with a docstring (its first line is what
``--list`` shows) and ``main(argv: list[str]) -> int``. Modules are loaded from their file,
only when chosen, under a private name: a benchmark called ``deepspeed.py`` never shadows
the real ``deepspeed`` package.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH_DIR = Path(__file__).resolve().parent

ALIASES = {"import": "import_cost"}
"""Names that are not valid module names (``import``) map to the file that implements them."""

# `python tools/bench/run.py` puts this directory first on sys.path; a benchmark file named
# like a real package (deepspeed.py) would then shadow it for every import that follows.
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != BENCH_DIR]


def available() -> dict[str, str]:
    """``{name: first docstring line}`` for every benchmark file, read without importing it."""
    files = {path.stem: path for path in sorted(BENCH_DIR.glob("*.py")) if not path.stem.startswith(("_", "run"))}
    names = {alias: stem for alias, stem in ALIASES.items() if stem in files}
    names.update({stem: stem for stem in files if stem not in names.values()})
    summaries = {}
    for name, stem in sorted(names.items()):
        docstring = ast.get_docstring(ast.parse(files[stem].read_text())) or ""
        summaries[name] = docstring.strip().splitlines()[0] if docstring.strip() else ""
    return summaries


def load(name: str) -> ModuleType:
    # Files named _*.py hold what several benchmarks share; they import them by that name (``import _ranks``),
    # which no installed package takes.
    for support in sorted(BENCH_DIR.glob("_*.py")):
        if support.stem not in sys.modules:
            _load_file(support, support.stem)
    stem = ALIASES.get(name, name)
    return _load_file(BENCH_DIR / f"{stem}.py", f"_stratagem_bench_{stem}")


def _load_file(path: Path, module_name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {module_name!r} from {path}")
    module = importlib.util.module_from_spec(spec)
    # dataclasses (and pickle) look a module up in sys.modules while it executes.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    benchmarks = available()
    listing = "\n".join(
        f"  {name.ljust(max(map(len, benchmarks), default=0))}  {line}" for name, line in benchmarks.items()
    )
    parser = argparse.ArgumentParser(
        prog="python tools/bench/run.py",
        description="Run a stratagem benchmark. Options after the name go to the benchmark (<name> --help).",
        epilog=f"benchmarks:\n{listing}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("name", nargs="?", help="the benchmark to run")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    arguments = list(sys.argv[1:] if argv is None else argv)
    # Everything after the name belongs to the benchmark, --help included.
    split = next((index + 1 for index, argument in enumerate(arguments) if not argument.startswith("-")), None)
    own, rest = (arguments, []) if split is None else (arguments[:split], arguments[split:])
    args = parser.parse_args(own)
    if args.list or args.name is None:
        print(listing)
        return 0
    if args.name not in benchmarks:
        parser.error(f"unknown benchmark {args.name!r}; available: {', '.join(benchmarks)}")
    return int(load(args.name).main(rest))


if __name__ == "__main__":
    sys.exit(main())
