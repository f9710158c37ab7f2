"""``stratagem plan``: what training a module would need per rank under every installed strategy, and which
one ``strategy="auto"`` would choose, without training (the module is built on the meta device)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from stratagem.cli import plan_cluster
from stratagem.cli.module_spec import build_module
from stratagem.cli.wiring_arguments import add_wiring_arguments, wiring_options

if TYPE_CHECKING:
    from stratagem.connector import WiringOptions
    from stratagem.planning import Plan


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Estimate the peak memory per rank (device, host, disk) of training MODULE under every installed strategy "
        "(or --strategies), from a copy built on the meta device, and say which fit the memory and disk visible "
        "here and which strategy='auto' would choose. With a cluster (--world-size, --device, ...): every "
        "strategy in every mesh layout of that cluster, ranked by a stated step-time model; --dry-run rehearses "
        "them on torch's fake process group."
    )
    parser.add_argument(
        "module", metavar="MODULE", help="the module class, as package.module:Class or path/to/file.py:Class"
    )
    parser.add_argument("--init-args", default="{}", help="keyword arguments for the class, as a JSON object")
    add_wiring_arguments(parser, accelerator="auto", devices="auto")
    parser.add_argument("--strategies", default=None, help="comma-separated names to plan (default: all registered)")
    parser.add_argument("--json", action="store_true", help="print the whole plan as JSON, every reason in full")
    plan_cluster.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from stratagem import registry
    from stratagem.connector import auto_strategy_name
    from stratagem.planning import plan, strategies_to_plan

    module = build_module(args.module, args.init_args)
    if plan_cluster.wants_cluster(args):
        return plan_cluster.run(args, module)
    options = wiring_options(args)
    # Without --strategies, the default of strategy="auto" first: the choice's one-line reason compares against it.
    names = plan_cluster.named_strategies(args) or strategies_to_plan(
        auto_strategy_name(_total_devices(options)), registry.strategies.names()
    )
    result = plan(module, names, **options)
    print(json.dumps(as_json(result), indent=2) if args.json else render(result))
    return 0


WIDTH = 100
"""Columns the rendered plan keeps to: a terminal's usual width, with room to spare."""


def render(result: Plan) -> str:
    """The footprint, one row per usable strategy, one line per reason the others cannot run here, and the
    choice; within :data:`WIDTH` columns (``--json`` keeps every detail)."""
    import textwrap

    from stratagem.planning.planner import size_text

    footprint = result.footprint
    heading = [
        f"model: {footprint.parameters:,} parameters; parameters {size_text(footprint.parameter_bytes)}, "
        f"gradients {size_text(footprint.gradient_bytes)}, "
        f"optimizer state {size_text(footprint.optimizer_state_bytes)}, "
        f"activations {size_text(footprint.activation_bytes)}",
        f"visible: host memory {size_text(result.resources.host_memory_bytes)}"
        + (
            f", device memory {size_text(result.resources.device_memory_bytes)}"
            if result.resources.device_memory_bytes is not None
            else ""
        )
        + f", free disk {size_text(result.resources.disk_bytes)}",
        *(f"note: {note}" for note in result.notes),
    ]
    lines = [part for line in heading for part in textwrap.wrap(line, WIDTH, subsequent_indent="  ")]
    usable = [candidate for candidate in result.candidates if candidate.estimate is not None]
    if usable:
        width = max(len("STRATEGY"), *(len(candidate.name) for candidate in usable))
        header = f"{'STRATEGY':<{width}} {'DEVICE/RANK':>11} {'HOST/RANK':>11} {'DISK/RANK':>11} {'STEP':>5}  FITS"
        lines += ["", header]
    for candidate in usable:
        estimate = candidate.estimate
        assert estimate is not None
        row = (
            f"{candidate.name:<{width}} {size_text(estimate.device_bytes):>11} {size_text(estimate.host_bytes):>11} "
            f"{size_text(estimate.disk_bytes):>11} {estimate.relative_step_time:>5.2f}  "
        )
        fits = "yes" if candidate.fits else f"no: {candidate.problem}"
        lines += textwrap.wrap(row + fits, WIDTH, subsequent_indent=" " * len(row), drop_whitespace=False) or [row]
    unusable = unusable_by_reason(result)
    if unusable:
        lines += ["", f"not usable here ({sum(len(names) for names in unusable.values())}):"]
    for reason, names in unusable.items():
        lines += textwrap.wrap(f"{', '.join(names)}: {reason}", WIDTH, initial_indent="- ", subsequent_indent="  ")
    lines += ["", "Sizes per rank; STEP is the declared step time relative to ddp.", result.reason()]
    return "\n".join(lines)


def unusable_by_reason(result: Plan) -> dict[str, list[str]]:
    """The strategies that cannot run here, grouped by why: each reason once, with the strategy's own name
    in it written as ``<name>`` where several share it, and the names it applies to."""
    groups: dict[str, list[str]] = {}
    reasons: dict[str, str] = {}
    for candidate in result.candidates:
        if candidate.estimate is not None:
            continue
        reason = (candidate.problem or "").removeprefix("not usable here: ")
        generic = reason.replace(repr(candidate.name), "<name>").replace(f'"{candidate.name}"', "<name>")
        groups.setdefault(generic, []).append(candidate.name)
        reasons.setdefault(generic, reason)
    # A reason that only one strategy has reads better with its name in it.
    return {(reasons[generic] if len(names) == 1 else generic): names for generic, names in groups.items()}


def as_json(result: Plan) -> dict[str, Any]:
    """The plan as plain data: the footprint, the resources, every candidate with its estimate or problem."""
    import dataclasses

    chosen = result.chosen
    return {
        "footprint": {
            field.name: getattr(result.footprint, field.name)
            for field in dataclasses.fields(result.footprint)
            if field.name != "module"
        },
        "resources": dataclasses.asdict(result.resources),
        "notes": list(result.notes),
        "candidates": [
            {
                "name": candidate.name,
                "fits": candidate.fits,
                "problem": candidate.problem,
                "memory_per_rank_bytes": candidate.memory_per_rank if candidate.estimate is not None else None,
                "estimate": dataclasses.asdict(candidate.estimate) if candidate.estimate is not None else None,
            }
            for candidate in result.candidates
        ],
        "chosen": chosen.name if chosen is not None else None,
        "reason": result.reason(),
    }


def _total_devices(options: WiringOptions) -> int:
    from stratagem.connector import resolve

    return resolve(strategy="auto", **options).world_size
