"""``stratagem <subcommand>``: the entry point, which imports only the subcommand that runs."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

from stratagem.printable import printable


@dataclass(frozen=True)
class Subcommand:
    module: str
    help: str


SUBCOMMANDS: dict[str, Subcommand] = {
    "strategies": Subcommand("stratagem.cli.strategies", "list strategies: distribution, usable here or why not"),
    "accelerators": Subcommand("stratagem.cli.accelerators", "list accelerators: distribution, usable here or why not"),
    "precisions": Subcommand("stratagem.cli.precisions", "list precisions: distribution, usable here or why not"),
    "environments": Subcommand(
        "stratagem.cli.environments", "list cluster environments: which are detected, which is used"
    ),
    "doctor": Subcommand(
        "stratagem.cli.doctor", "report versions, devices, cluster environment, plugins and their problems"
    ),
    "demo": Subcommand("stratagem.cli.demo", "train a small built-in model on synthetic data"),
    "plan": Subcommand(
        "stratagem.cli.plan", "estimate memory per rank of training a module under every strategy; say what fits"
    ),
    "consolidate": Subcommand(
        "stratagem.cli.consolidate", "merge a sharded checkpoint into one file, or its weights into HF safetensors"
    ),
}
"""Every subcommand: its module (imported only when it runs) and its one-line help."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``stratagem`` with ``argv`` (default: the command line); return the exit status."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="stratagem",
        description="Choose how PyTorch training is distributed, by name. Plugins add names through entry points.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_commands_table(),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    subparsers = parser.add_subparsers(
        dest="command", metavar="<command>", required=True, help="one of the commands below; <command> --help"
    )
    parsers = {
        name: subparsers.add_parser(name, description=subcommand.help) for name, subcommand in SUBCOMMANDS.items()
    }
    chosen = next((argument for argument in arguments if not argument.startswith("-")), None)
    module = None
    if chosen in SUBCOMMANDS:
        module = _load(chosen)
        if module is None:
            return 2
        module.add_arguments(parsers[chosen])
    args = parser.parse_args(arguments)
    if module is None:  # argparse has already exited on anything but a known subcommand
        return 2
    try:
        return int(module.run(args))
    except BrokenPipeError:
        # The reader (e.g. `| head`) went away; stop quietly instead of failing again at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as error:
        from stratagem.registry import PluginError  # not imported up front: `--help` stays light

        if not isinstance(error, ValueError | TypeError | PluginError):
            raise
        # Messages carry text from files (a checkpoint's entries, a plugin's error): control sequences are escaped.
        print(f"stratagem {chosen}: error: {printable(error, 20_000, keep_newlines=True)}", file=sys.stderr)
        return 2


def _load(name: str) -> ModuleType | None:
    module_name = SUBCOMMANDS[name].module
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name != module_name:
            raise
    print(
        f"stratagem {name}: error: the '{name}' command is not available in this installation of stratagem "
        f"({module_name} is missing).",
        file=sys.stderr,
    )
    return None


def _commands_table() -> str:
    width = max(map(len, SUBCOMMANDS))
    return "commands:\n" + "\n".join(f"  {name.ljust(width)}  {command.help}" for name, command in SUBCOMMANDS.items())


def _version() -> str:
    from importlib import metadata

    return metadata.version("stratagem")


if __name__ == "__main__":
    sys.exit(main())
