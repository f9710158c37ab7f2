"""``stratagem doctor``: what this installation sees, and every plugin that failed and why.

Exits 0 even when it finds problems: its job is to report them.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import warnings
from importlib import metadata
from typing import Any

from stratagem import registry
from stratagem.cli._listing import format_table
from stratagem.printable import printable
from stratagem.registry import PluginError

DETAIL_CHARACTERS = 20_000
"""How much of one value (an error, a traceback) the report shows."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a report")
    parser.add_argument("--tracebacks", action="store_true", help="show the full traceback of every plugin problem")


def run(args: argparse.Namespace) -> int:
    report = collect()
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(report, tracebacks=args.tracebacks))
    return 0


def collect() -> dict[str, Any]:
    """Everything the report shows, as plain data."""
    return {
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "platform": platform.platform(),
        "stratagem": metadata.version("stratagem"),
        "torch": _torch_versions(),
        "accelerators": _accelerators(),
        "cluster_environment": _cluster_environment(),
        "plugins": _plugins(),
        "problems": _problems(),
    }


def render(report: dict[str, Any], tracebacks: bool = False) -> str:
    """The report for people. Every value is shown with its control characters escaped: plugin metadata,
    error messages and environment variables come from outside and could otherwise drive the terminal."""
    report = _printable_values(report)
    torch_info = report["torch"]
    lines = [
        f"python     {report['python']['version']} ({report['python']['executable']})",
        f"platform   {report['platform']}",
        f"stratagem  {report['stratagem']}",
        f"torch      {torch_info['version']} (CUDA {torch_info['cuda'] or 'none'}, HIP {torch_info['hip'] or 'none'})",
        "",
        "accelerators:",
    ]
    for name, seen in report["accelerators"].items():
        status = f"{seen['devices']} device(s)" if seen["available"] else f"not available: {seen['reason']}"
        lines.append(f"  {name.ljust(14)}{status}")
    environment = report["cluster_environment"]
    lines += ["", "cluster environment:"]
    if environment["error"]:
        lines.append(f"  could not be detected: {environment['error']}")
    else:
        lines.append(f"  {environment['name']} ({environment['repr']})")
        if environment["place"]:
            lines.append(f"  {environment['place']}")
    lines += ["", "plugins:"]
    if report["plugins"]:
        rows = [[p["distribution"], p["version"], p["group"], p["entry_point"]] for p in report["plugins"]]
        table = format_table(["DISTRIBUTION", "VERSION", "GROUP", "ENTRY POINT"], rows)
        lines += [f"  {line}" for line in table.splitlines()]
    else:
        lines.append("  none installed")
    lines += ["", f"problems: {len(report['problems']) or 'none'}"]
    for problem in report["problems"]:
        lines.append(f"  {problem['distribution']} [{problem['group']}] {problem['entry_point']}")
        lines.append(f"    {problem['error']}")
        if tracebacks and problem["details"]:
            lines += [f"      {line}" for line in problem["details"].rstrip().splitlines()]
    return "\n".join(lines) + "\n"


def _printable_values(value: Any, multiline: bool = False) -> Any:
    # Only a traceback keeps its line breaks: in any other value one would forge a line of the report.
    if isinstance(value, dict):
        return {key: _printable_values(item, multiline=key == "details") for key, item in value.items()}
    if isinstance(value, list):
        return [_printable_values(item) for item in value]
    if isinstance(value, str):
        return printable(value, DETAIL_CHARACTERS, keep_newlines=multiline)
    return value


def _torch_versions() -> dict[str, str | None]:
    import torch

    return {"version": torch.__version__, "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None)}


def _accelerators() -> dict[str, dict[str, Any]]:
    seen: dict[str, dict[str, Any]] = {}
    for name in registry.accelerators.names():
        try:
            description = registry.accelerators.describe(name)
            devices = 0
            if description.available:
                accelerator_class = registry.accelerators.load_target(name)
                devices = registry.accelerators.call_plugin(name, "device_count()", accelerator_class.device_count)
            seen[name] = {"available": description.available, "devices": devices, "reason": description.reason}
        except (PluginError, ValueError) as error:  # a broken accelerator plugin is reported, not fatal
            seen[name] = {"available": False, "devices": 0, "reason": str(error)}
    return seen


def _cluster_environment() -> dict[str, str | None]:
    from stratagem.connector import detect_environment

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a failing plugin environment is listed in problems
            environment = detect_environment()
    except Exception as error:  # e.g. a scheduler variable that is not a number
        return {"name": None, "repr": None, "error": f"{type(error).__name__}: {error}", "place": None}
    name = next(
        (name for name in registry.environments.names() if _environment_class(name) is type(environment)),
        type(environment).__name__,
    )
    return {"name": name, "repr": repr(environment), "error": None, "place": _place_in_job(environment)}


def _place_in_job(environment: Any) -> str | None:
    """Where the scheduler put this process, or why its variables cannot be read (None without a scheduler)."""
    if not environment.creates_processes_externally:
        return None
    try:
        return (
            f"rank {environment.global_rank()} of {environment.world_size()}, local rank "
            f"{environment.local_rank()} on node {environment.node_rank()}, rendezvous at "
            f"{environment.main_address}:{environment.main_port}"
        )
    except ValueError as error:
        return f"cannot be read: {error}"


def _environment_class(name: str) -> Any:
    try:
        return registry.environments.load_target(name)
    except Exception:  # a conflicting or unimportable plugin environment is not the detected one
        return None


def _plugins() -> list[dict[str, str]]:
    """Every entry point in the stratagem groups, with the distribution and version that provide it."""
    plugins = []
    for kind_registry in registry.ALL:
        for entry_point in metadata.entry_points(group=kind_registry.group):
            distribution = entry_point.dist
            plugins.append(
                {
                    "distribution": distribution.name if distribution is not None else "?",
                    "version": distribution.version if distribution is not None else "?",
                    "group": kind_registry.group,
                    "entry_point": f"{entry_point.name} = {entry_point.value}",
                }
            )
    return sorted(plugins, key=lambda plugin: (plugin["distribution"], plugin["group"], plugin["entry_point"]))


def _problems() -> list[dict[str, str]]:
    """Every plugin problem: those met while registering and running plugin code, targets that cannot be
    imported or used (checked now), and entry points in a ``stratagem.*`` group no registry reads."""
    for kind_registry in registry.ALL:
        kind_registry.check_targets()
    problems = [problem for kind_registry in registry.ALL for problem in kind_registry.problems()]
    problems += registry.unknown_group_problems(kind_registry.group for kind_registry in registry.ALL)
    return [
        {
            "group": problem.group,
            "distribution": problem.distribution,
            "entry_point": problem.entry_point,
            "stage": problem.stage,
            "error": problem.error,
            "details": problem.details,
        }
        for problem in problems
    ]
