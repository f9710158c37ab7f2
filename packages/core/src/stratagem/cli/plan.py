"""``stratagem plan``: what training a module would need per rank under every installed strategy, and which
one ``strategy="auto"`` would choose, without training (the module is built on the meta device)."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stratagem.config_values import parse_json
from stratagem.printable import shown_repr

if TYPE_CHECKING:
    from torch import nn

    from stratagem.planning import Plan


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Estimate the peak memory per rank (device, host, disk) of training MODULE under every installed strategy "
        "(or --strategies), from a copy built on the meta device, and say which fit the memory and disk visible "
        "here and which strategy='auto' would choose."
    )
    parser.add_argument(
        "module", metavar="MODULE", help="the module class, as package.module:Class or path/to/file.py:Class"
    )
    parser.add_argument("--init-args", default="{}", help="keyword arguments for the class, as a JSON object")
    parser.add_argument("--accelerator", default="auto", help="cpu, cuda, mps, gpu or auto (default: auto)")
    parser.add_argument("--devices", default="auto", help="a count, a list such as 0,1, or auto (default: auto)")
    parser.add_argument("--num-nodes", type=int, default=1, help="number of machines (default: 1)")
    parser.add_argument("--precision", default=None, help="32-true, bf16-mixed, bf16-true, ... (default: 32-true)")
    parser.add_argument("--strategies", default=None, help="comma-separated names to plan (default: all registered)")


def run(args: argparse.Namespace) -> int:
    from stratagem import registry
    from stratagem.connector import auto_strategy_name
    from stratagem.planning import plan, strategies_to_plan

    module = build_module(args.module, args.init_args)
    options: dict[str, Any] = {
        "accelerator": args.accelerator,
        "devices": _devices(args.devices),
        "num_nodes": args.num_nodes,
        "precision": args.precision,
    }
    if args.strategies:
        names = [name.strip() for name in args.strategies.split(",") if name.strip()]
        for name in names:
            if name not in registry.strategies:
                raise ValueError(f"--strategies: {registry.strategies.unknown_name_error(name)}")
    else:
        # The default of strategy="auto" first: the choice's one-line reason compares against it.
        names = strategies_to_plan(auto_strategy_name(_total_devices(options)), registry.strategies.names())
    result = plan(module, names, **options)
    print(render(result))
    return 0


def build_module(spec: str, init_args: str) -> nn.Module:
    """Import ``package.module:Class`` or ``file.py:Class`` and create it with the JSON ``init_args``."""
    from torch import nn

    location, separator, class_name = spec.rpartition(":")
    if not separator or not location or not class_name:
        raise ValueError(f"MODULE={spec!r} is not valid; expected package.module:Class or path/to/file.py:Class.")
    shown = f"--init-args={shown_repr(init_args)}"
    kwargs = parse_json(init_args, shown)
    if not isinstance(kwargs, dict):
        raise ValueError(f"{shown} is not valid; expected a JSON object of keyword arguments.")
    if location.endswith(".py"):
        path = Path(location)
        if not path.is_file():
            raise ValueError(f"MODULE={spec!r}: the file {location} does not exist.")
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        assert module_spec is not None
        assert module_spec.loader is not None
        source = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(source)
    else:
        try:
            source = importlib.import_module(location)
        except ImportError as error:
            raise ValueError(f"MODULE={spec!r}: cannot import {location} ({error}).") from None
    found = getattr(source, class_name, None)
    if not isinstance(found, type) or not issubclass(found, nn.Module):
        raise ValueError(f"MODULE={spec!r}: {location} has no nn.Module class named {class_name!r}.")
    return found(**kwargs)


def render(result: Plan) -> str:
    """The footprint, one row per strategy, and the choice."""
    from stratagem.planning.planner import size_text

    footprint = result.footprint

    lines = [
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
        "",
        f"{'STRATEGY':<42} {'DEVICE/RANK':>11} {'HOST/RANK':>11} {'DISK/RANK':>11} {'STEP':>5}  FITS",
    ]
    for candidate in result.candidates:
        estimate = candidate.estimate
        if estimate is None:
            lines.append(f"{candidate.name:<42} {'-':>11} {'-':>11} {'-':>11} {'-':>5}  {candidate.problem}")
            continue
        fits = "yes" if candidate.fits else f"no: {candidate.problem}"
        lines.append(
            f"{candidate.name:<42} {size_text(estimate.device_bytes):>11} {size_text(estimate.host_bytes):>11} "
            f"{size_text(estimate.disk_bytes):>11} {estimate.relative_step_time:>5.2f}  {fits}"
        )
    lines += ["", "Sizes per rank; STEP is the declared step time relative to ddp.", result.reason()]
    return "\n".join(lines)


def _devices(value: str) -> Any:
    if value == "auto":
        return value
    if "," in value:
        return [int(part) for part in value.split(",") if part.strip()]
    return int(value) if value.isdigit() else value


def _total_devices(options: dict[str, Any]) -> int:
    from stratagem.connector import resolve

    return resolve(strategy="auto", **options).world_size
