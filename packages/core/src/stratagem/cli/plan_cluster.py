"""``stratagem plan MODULE --world-size N``: plan a job for a cluster this machine is not, and with ``--dry-run``
rehearse its layouts on torch's fake process group in this one process."""

from __future__ import annotations

import argparse
import math
import textwrap
from typing import TYPE_CHECKING, Any

from stratagem.planning.devices import DEFAULT_DEVICE, DEVICES, device_spec, parse_size

if TYPE_CHECKING:
    from torch import nn

    from stratagem.planning.cluster import ClusterPlan, LayoutCandidate
    from stratagem.planning.rehearsal import Rehearsal
    from stratagem.planning.workload import Workload

WIDTH = 100
DEFAULT_DEVICES_PER_NODE = 8
DEFAULT_ROWS = 20
TOLERANCE = 0.01
"""How far the plan's model state per rank may be from the dry run's before the dry run says they disagree."""

_SHORT = {"pp": "P", "dp_replicate": "R", "dp_shard": "S", "tp": "T"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "a cluster (any of --world-size, --devices-per-node, --device, --device-memory plans for one)"
    )
    group.add_argument("--world-size", type=int, default=None, help="ranks of the job (default: nodes x per node)")
    group.add_argument(
        "--devices-per-node", type=int, default=None, help=f"devices per node (default: {DEFAULT_DEVICES_PER_NODE})"
    )
    group.add_argument("--device", default=None, help=f"the device: {', '.join(DEVICES)} (default: {DEFAULT_DEVICE})")
    group.add_argument("--device-memory", default=None, help="memory per device, e.g. 80GiB (default: the device's)")
    group.add_argument("--seq-len", type=int, default=None, help="tokens per sequence of the micro-batch")
    group.add_argument("--batch-size", type=int, default=None, help="sequences per micro-batch per data rank")
    group.add_argument("--mfu", type=float, default=None, help="share of the bf16 peak compute reaches (0.4)")
    group.add_argument("--micro-batches", type=int, default=1, help="micro-batches per step (pipeline layouts)")
    group.add_argument(
        "--auto-wrap",
        default=None,
        help="shard each module of this class as one unit: package.module:Class, or "
        "'blocks' for the class of the model's repeated blocks",
    )
    group.add_argument(
        "--activation-checkpointing",
        default=None,
        help="recompute the activations of this class in backward (as --auto-wrap)",
    )
    group.add_argument("--rows", type=int, default=DEFAULT_ROWS, help=f"layouts shown (default: {DEFAULT_ROWS})")
    group.add_argument(
        "--dry-run", action="store_true", help="rehearse each strategy's best layout on torch's fake process group"
    )
    group.add_argument("--all-ranks", action="store_true", help="with --dry-run, play a sample of ranks, not rank 0")


def wants_cluster(args: argparse.Namespace) -> bool:
    return any(
        value is not None for value in (args.world_size, args.devices_per_node, args.device, args.device_memory)
    ) or bool(args.dry_run)


def run(args: argparse.Namespace, module: nn.Module) -> int:
    """Check every cluster option, plan, rehearse when asked, print."""
    import json

    from stratagem.planning.cluster import DEFAULT_MFU, ClusterTarget, plan_cluster
    from stratagem.planning.workload import measure_workload

    target = ClusterTarget(
        *_world(args),
        device=_device(args),
        mfu=DEFAULT_MFU if args.mfu is None else _mfu(args.mfu),
        micro_batches=_positive("--micro-batches", args.micro_batches),
    )
    for option, value in (("--seq-len", args.seq_len), ("--batch-size", args.batch_size), ("--rows", args.rows)):
        if value is not None:
            _positive(option, value)
    precision = _precision(args.precision)
    workload = measure_workload(module, precision, args.batch_size, args.seq_len)
    strategies = _strategies(args, workload)
    plan = plan_cluster(
        module, strategies, target, precision, default_strategy=_default_name(target), workload=workload
    )
    rehearsals = _rehearse(plan, strategies, module, precision, args) if args.dry_run else []
    print(json.dumps(as_json(plan, rehearsals), indent=2) if args.json else render(plan, rehearsals, args.rows))
    return 0


def _world(args: argparse.Namespace) -> tuple[int, int]:
    per_node = _positive("--devices-per-node", args.devices_per_node or DEFAULT_DEVICES_PER_NODE)
    nodes = _positive("--num-nodes", args.num_nodes)
    if args.world_size is None:
        return nodes * per_node, per_node
    world = _positive("--world-size", args.world_size)
    if nodes > 1 and nodes * per_node != world:
        raise ValueError(
            f"--world-size={world} contradicts --num-nodes={nodes} x --devices-per-node={per_node} = "
            f"{nodes * per_node}; give one of them."
        )
    if world > per_node and world % per_node:
        raise ValueError(
            f"--world-size={world} is not a whole number of nodes of --devices-per-node={per_node}; give a multiple "
            f"of {per_node}, or --devices-per-node."
        )
    return world, min(per_node, world)


def _device(args: argparse.Namespace) -> Any:
    from dataclasses import replace

    spec = device_spec(args.device or DEFAULT_DEVICE)
    if args.device_memory is not None:
        spec = replace(spec, memory_bytes=parse_size(args.device_memory, "--device-memory"))
    return spec


def _mfu(value: float) -> float:
    if not 0 < value <= 1:
        raise ValueError(f"--mfu={value} is not valid; expected a share of the peak in (0, 1], e.g. 0.4.")
    return value


def _positive(option: str, value: int) -> int:
    if value < 1:
        raise ValueError(f"{option}={value} is not valid; expected a positive whole number.")
    return value


def _precision(name: str | None) -> Any:
    from stratagem.connector import _resolve_precision
    from stratagem.precision import Precision

    return _resolve_precision(name, None) or Precision()


def named_strategies(args: argparse.Namespace) -> list[str]:
    """The registered names ``--strategies`` gives (none when it is not given); an unknown one is refused, with
    the registry's close matches."""
    from stratagem import registry

    names = [name.strip() for name in (args.strategies or "").split(",") if name.strip()]
    for name in names:
        if name not in registry.strategies:
            raise ValueError(f"--strategies: {registry.strategies.unknown_name_error(name)}")
    return names


def _default_name(target: Any) -> str:
    from stratagem.connector import auto_strategy_name

    return auto_strategy_name(target.world_size)


def _strategies(args: argparse.Namespace, workload: Workload) -> dict[str, Any]:
    """Each name to plan, created unconfigured with the policy options, or the text of why it cannot be."""
    from stratagem import registry

    names = named_strategies(args) or registry.strategies.names()
    options = {
        option: {_module_class(value, flag, workload)}
        for option, flag, value in (
            ("auto_wrap_policy", "--auto-wrap", args.auto_wrap),
            ("activation_checkpointing_policy", "--activation-checkpointing", args.activation_checkpointing),
        )
        if value is not None
    }
    created: dict[str, Any] = {}
    for name in names:
        try:
            created[name] = _create(name, options)
        except Exception as error:  # a plugin that cannot be created here is listed with why, not planned
            created[name] = f"cannot be created here: {type(error).__name__}: {error}"
    return created


def _create(name: str, options: dict[str, Any]) -> Any:
    from stratagem import registry
    from stratagem.registry.registry import _accepted_options

    accepted = _accepted_options(registry.strategies.load_target(name))
    given = {option: value for option, value in options.items() if accepted is None or option in accepted}
    return registry.strategies.create(name, **given)


def _module_class(value: str, flag: str, workload: Workload) -> type:
    import importlib

    from torch import nn

    if value == "blocks":
        if workload.block is None:
            raise ValueError(f"{flag}=blocks: the model has no repeated blocks (no ModuleList or Sequential of them)")
        return type(workload.block)
    location, separator, name = value.rpartition(":")
    if not separator:
        raise ValueError(f"{flag}={value!r} is not valid; expected package.module:Class or 'blocks'.")
    try:
        found = getattr(importlib.import_module(location), name, None)
    except ImportError as error:
        raise ValueError(f"{flag}={value!r}: cannot import {location} ({error}).") from None
    if not isinstance(found, type) or not issubclass(found, nn.Module):
        raise ValueError(f"{flag}={value!r}: {location} has no nn.Module class named {name!r}.")
    return found


def _rehearse(
    plan: ClusterPlan, strategies: dict[str, Any], module: nn.Module, precision: Any, args: argparse.Namespace
) -> list[Rehearsal]:
    """Each strategy's fastest layout that fits and its default layout, and the auto choice."""
    from stratagem.planning.rehearsal import rehearse, sample_ranks
    from stratagem.planning.workload import micro_batch_input

    example = micro_batch_input(module, args.batch_size, args.seq_len)
    chosen: dict[tuple[str, tuple[int, ...]], LayoutCandidate] = {}
    best_of: set[str] = set()
    for candidate in plan.ranked:
        if candidate.fits and candidate.name not in best_of:
            best_of.add(candidate.name)
            chosen[(candidate.name, tuple(candidate.layout.values()))] = candidate
        if candidate.is_default:
            chosen.setdefault((candidate.name, tuple(candidate.layout.values())), candidate)
    return [
        rehearse(
            module,
            candidate.name,
            strategies[candidate.name],
            candidate.layout,
            sample_ranks(candidate.layout, args.all_ranks),
            precision,
            example,
        )
        for candidate in chosen.values()
    ]


def layout_text(layout: dict[str, int]) -> str:
    """``S128 T8``: the sizes above 1, by the letters of the table's legend."""
    shown = [f"{_SHORT[name]}{size}" for name, size in layout.items() if size > 1]
    return " ".join(shown) or "S1"


def _size(value: float) -> str:
    """Bytes in at most six characters: ``12.3G``, ``456M``, ``7.8M``, ``12K``."""
    for unit, scale in (("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if value >= scale:
            shown = value / scale
            return f"{shown:.1f}{unit}" if shown < 100 else f"{shown:.0f}{unit}"
    return f"{value:.0f}"


def render(plan: ClusterPlan, rehearsals: list[Rehearsal], rows: int | None = DEFAULT_ROWS) -> str:
    """The workload, the target, one row per layout (the fastest that fit first), the choice, what was left out,
    and the dry run's ranks; within :data:`WIDTH` columns."""
    from stratagem.planning.cluster import describe_rows
    from stratagem.planning.planner import SAFETY_MARGIN

    target, workload = plan.target, plan.workload
    footprint = workload.footprint
    device = target.device
    tokens = math.prod(workload.micro_batch) if workload.micro_batch else 0
    heading = [
        f"model: {footprint.parameters:,} parameters; micro-batch {workload.micro_batch} = {tokens:,} tokens; "
        f"forward {workload.forward_flops / 1e12:,.1f} TFLOP",
        f"target: {target.world_size} x {device.name} ({target.num_nodes} node(s) of {target.devices_per_node}): "
        f"{_size(device.memory_bytes)} each, {device.bf16_flops / 1e12:,.0f} TFLOP/s bf16 at {target.mfu:.0%} MFU, "
        f"{device.intra_node_bytes_per_s / 1e9:,.0f} GB/s within a node, {device.inter_node_bytes_per_s / 1e9:,.0f} "
        "GB/s across",
        *(f"note: {note}" for note in plan.notes),
    ]
    lines = [part for line in heading for part in textwrap.wrap(line, WIDTH, subsequent_indent="  ")]
    shown = describe_rows(plan, rows)
    width = max([len("STRATEGY"), *(len(candidate.name) for candidate in shown)])
    lines += [
        "",
        f"{'STRATEGY':<{width}} {'LAYOUT':<12} {'PARAM':>6} {'GRAD':>6} {'OPTIM':>6} {'ACTIV':>6} {'BUFS':>6} "
        f"{'DEVICE':>6} {'STEP s':>7} {'TOK/S/GPU':>9}  FITS",
    ]
    for candidate in shown:
        memory = candidate.memory
        throughput = candidate.tokens_per_second_per_device(target.world_size)
        step = f"{candidate.step.total:7.2f}" if candidate.step is not None else f"{'?':>7}"
        fits = "yes" if candidate.fits else "no"
        if candidate.fits and memory.host:
            fits += f", {_size(memory.host)} host"
        elif candidate.problem and candidate.problem != "does not fit":
            fits += f": {candidate.problem}"
        row = (
            f"{candidate.name:<{width}} {layout_text(candidate.layout):<12} {_size(memory.parameters):>6} "
            f"{_size(memory.gradients):>6} {_size(memory.optimizer_state):>6} {_size(memory.activations):>6} "
            f"{_size(memory.buffers):>6} {_size(memory.device):>6} {step} "
            f"{(f'{throughput:,.0f}' if throughput is not None else '?'):>9}  {fits}"
        )
        lines += textwrap.wrap(row, WIDTH, subsequent_indent=" " * 4) or [row]
    hidden = len(plan.candidates) - len(shown)
    lines += textwrap.wrap(
        (f"{hidden} more layout(s) in --json (or --rows). " if hidden > 0 else "")
        + "LAYOUT: R dp_replicate, S dp_shard, T tp, P pp (sizes above 1). Sizes per rank; DEVICE = what lives on "
        f"the device, fitting in {SAFETY_MARGIN:.0%} of it. STEP: compute (3 x forward FLOPs over tp x pp at the "
        "MFU) or data-parallel traffic, whichever is longer, plus tensor-parallel traffic; ranked by time per token.",
        WIDTH,
    )
    lines += ["", *textwrap.wrap(_choice_lines(plan), WIDTH, subsequent_indent="  ")]
    aliases = [f"{c.name} = {', '.join(c.strategies[1:])}" for c in _distinct(plan.candidates) if c.strategies[1:]]
    if aliases:
        lines += textwrap.wrap("planned alike: " + "; ".join(aliases), WIDTH, subsequent_indent="  ")
    for reason, names in _left_out_by_reason(plan).items():
        lines += textwrap.wrap(f"not planned: {', '.join(names)}: {reason}", WIDTH, subsequent_indent="  ")
    if rehearsals:
        lines += ["", "dry run (torch's fake process group; the module on the meta device; this one process):"]
        for rehearsal in rehearsals:
            lines += _rehearsal_lines(rehearsal, plan)
    return "\n".join(lines)


def _choice_lines(plan: ClusterPlan) -> str:
    auto = plan.auto_choice
    best = next((candidate for candidate in plan.ranked if candidate.fits), None)
    if best is None:
        smallest = min(plan.candidates, key=lambda candidate: candidate.memory.device, default=None)
        tail = f"; the smallest is {smallest.name} {layout_text(smallest.layout)}" if smallest is not None else ""
        return f"nothing fits {_size(plan.target.device.memory_bytes)} per device{tail}"
    text = f"fastest that fits: {best.name} {layout_text(best.layout)}"
    if best.options:
        text += f" ({best.name}: {best.options})"
    if auto is None:
        return text + "; strategy='auto' would find nothing that fits in its default layouts"
    return text + f"; strategy='auto' would choose {auto.name} ({layout_text(auto.layout)}, its default layout)"


def _distinct(candidates: list[LayoutCandidate]) -> list[LayoutCandidate]:
    seen: dict[str, LayoutCandidate] = {}
    for candidate in candidates:
        seen.setdefault(candidate.name, candidate)
    return list(seen.values())


def _left_out_by_reason(plan: ClusterPlan) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for name, reason in plan.left_out.items():
        groups.setdefault(reason, []).append(name)
    return groups


def _rehearsal_lines(rehearsal: Rehearsal, plan: ClusterPlan) -> list[str]:
    head = f"- {rehearsal.strategy} {layout_text(rehearsal.layout)}: "
    if rehearsal.not_rehearsed is not None:
        return textwrap.wrap(head + f"not rehearsed: {rehearsal.not_rehearsed}", WIDTH, subsequent_indent="    ")
    planned = _planned(plan, rehearsal)
    lines = textwrap.wrap(
        head + f"{len(rehearsal.ranks)} rank(s) in {rehearsal.seconds:.1f} s, peak RSS "
        f"{_size(rehearsal.peak_rss_bytes)}",
        WIDTH,
    )
    for rank in rehearsal.ranks:
        if not rank.model_state_bytes:
            continue
        where = ", ".join(
            f"{_SHORT[name]}{value}" for name, value in rank.coordinates.items() if rehearsal.layout[name] > 1
        )
        agreement = ""
        if planned is not None:
            error = rank.model_state_bytes / planned.memory.model_state - 1 if planned.memory.model_state else 0.0
            agreement = f" (plan {_size(planned.memory.model_state)}, {error:+.1%})"
        text = (
            f"rank {rank.rank} ({where or 'the only one'}): params {_size(rank.parameter_bytes)}, grads "
            f"{_size(rank.gradient_bytes)}, optim {_size(rank.optimizer_state_bytes)} = "
            f"{_size(rank.model_state_bytes)}{agreement}"
        )
        if rank.largest_shard is not None:
            name, whole, local = rank.largest_shard
            text += f"; largest shard {name} {whole} -> {local}"
        lines += textwrap.wrap(text, WIDTH, initial_indent="    ", subsequent_indent="      ")
    for problem in rehearsal.problems:
        lines += textwrap.wrap(f"problem: {problem}", WIDTH, initial_indent="    ", subsequent_indent="      ")
    return lines


def _planned(plan: ClusterPlan, rehearsal: Rehearsal) -> LayoutCandidate | None:
    for candidate in plan.candidates:
        if rehearsal.strategy in candidate.strategies and candidate.layout == rehearsal.layout:
            return candidate
    return None


def as_json(plan: ClusterPlan, rehearsals: list[Rehearsal]) -> dict[str, Any]:
    """Every candidate with every part of its memory and step time, the choice, and the dry run's ranks."""
    import dataclasses

    footprint = plan.workload.footprint
    auto = plan.auto_choice

    def candidate_json(candidate: LayoutCandidate) -> dict[str, Any]:
        memory = candidate.memory
        return {
            "strategies": candidate.strategies,
            "layout": candidate.layout,
            "options": candidate.options,
            "is_default": candidate.is_default,
            "fits": candidate.fits,
            "problem": candidate.problem,
            "memory_bytes": {**dataclasses.asdict(memory), "device": memory.device},
            "step_seconds": {**dataclasses.asdict(candidate.step), "total": candidate.step.total}
            if candidate.step is not None
            else None,
            "tokens_per_step": candidate.tokens_per_step,
            "tokens_per_second_per_device": candidate.tokens_per_second_per_device(plan.target.world_size),
        }

    def rehearsal_json(rehearsal: Rehearsal) -> dict[str, Any]:
        planned = _planned(plan, rehearsal)
        return {
            **dataclasses.asdict(rehearsal),
            "problems": rehearsal.problems,
            "planned_model_state_bytes": planned.memory.model_state if planned is not None else None,
        }

    return {
        "target": {**dataclasses.asdict(plan.target), "num_nodes": plan.target.num_nodes},
        "workload": {
            "parameters": footprint.parameters,
            "parameter_bytes": footprint.parameter_bytes,
            "gradient_bytes": footprint.gradient_bytes,
            "optimizer_state_bytes": footprint.optimizer_state_bytes,
            "activation_bytes": footprint.activation_bytes,
            "micro_batch": plan.workload.micro_batch,
            "forward_flops": plan.workload.forward_flops,
            "compute_element_bytes": plan.workload.compute_element_bytes,
            "block_output_bytes": plan.workload.block_output_bytes,
        },
        "notes": plan.notes,
        "candidates": [candidate_json(candidate) for candidate in plan.ranked],
        "auto": {"strategy": auto.name, "layout": auto.layout} if auto is not None else None,
        "left_out": plan.left_out,
        "dry_run": [rehearsal_json(rehearsal) for rehearsal in rehearsals],
    }
