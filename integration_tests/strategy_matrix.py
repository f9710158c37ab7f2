"""Which strategies and precisions the matrix covers, read from the registries of what is installed.

Nothing here names a strategy: a package joins the matrix by registering names. A name that
cannot run on this machine is kept with the reason ``resolve`` gives, so that the test
report says why it was left out instead of leaving it out silently.

Each name runs on the CPU where it can, else on the first other available accelerator that takes it.
Vendor software that cannot be had here (Habana's bridge, PopTorch) is replaced by the CPU stand-ins the
packages keep with their tests (``packages/*/tests/standin``), put on the path of this process and of the
processes it starts (spawned workers inherit ``sys.path``), so that those names and their accelerators
join the matrix as they would on the vendor's machine.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement

STANDINS = [str(path) for path in sorted(Path(__file__).resolve().parents[1].glob("packages/*/tests/standin"))]
sys.path[:0] = [path for path in STANDINS if path not in sys.path]

import stratagem  # noqa: E402 - the registry must see the stand-ins' metadata
from stratagem import registry  # noqa: E402
from stratagem.strategies import ParallelStrategy  # noqa: E402

CPU = "cpu"
PARALLEL_DEVICES = 2
# Under an external launcher (the matrix's worker pool) every start method runs in place, so
# names that differ only in how they would start processes load and save alike.
LAUNCH_ONLY_OPTIONS = frozenset({"start_method"})


@dataclass(frozen=True)
class StrategyCase:
    name: str
    devices: int
    configuration: tuple[str, str]
    """The target and the options that are not launch-only: names sharing one are the same configuration."""
    accelerator: str = CPU

    @property
    def parallel(self) -> bool:
        return self.devices > 1


def _resolve(name: str, accelerator: str, devices: int, precision: str = "32-true") -> stratagem.strategies.Strategy:
    saved = {variable: os.environ.pop(variable) for variable in list(os.environ) if variable in _LAUNCH_VARIABLES}
    try:
        return stratagem.resolve(strategy=name, accelerator=accelerator, devices=devices, precision=precision)
    finally:
        os.environ.update(saved)


def available_accelerators() -> list[str]:
    """The CPU, then every other registered accelerator that is available here."""
    others = [name for name in registry.accelerators.names() if name != CPU]
    return [CPU, *(name for name in others if registry.accelerators.describe(name).available)]


_LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "GROUP_RANK", "SLURM_NTASKS")


def discover() -> tuple[list[StrategyCase], dict[str, str]]:
    """Every registered strategy: the ones that run here, and why each other one does not."""
    runnable: list[StrategyCase] = []
    refused: dict[str, str] = {}
    accelerators = available_accelerators()
    off_cpu: dict[str, StrategyCase] = {}
    for name in registry.strategies.names():
        case, reasons = _first_case(name, accelerators)
        if case is None:
            refused[name] = " | ".join(reasons)
            continue
        left_out = None if case.accelerator == CPU else _left_out_off_cpu(case, off_cpu)
        if left_out is not None:
            refused[name] = left_out
            continue
        runnable.append(case)
        if case.accelerator != CPU:
            off_cpu.setdefault(case.configuration[0], case)
    return runnable, refused


def _left_out_off_cpu(case: StrategyCase, covered: dict[str, StrategyCase]) -> str | None:
    """Why a name that runs on another accelerator than the CPU (here: through a vendor's stand-in) is left out
    of the matrix, or ``None``.

    What the matrix checks is what a strategy saves and loads, which depends on its class, not on an alias's
    options (those are covered on the CPU by the package they come from): one configuration per class is
    enough (its aliases run, as on the CPU). A composition with another package's registered strategy (its
    registration requires that package) saves as that strategy does, which is covered on the CPU; its runs
    through the stand-in are its own package's tests. Leaving these out keeps the matrix within the
    integration env's time budget.
    """
    target = case.configuration[0]
    first = covered.get(target)
    if first is not None and first.configuration != case.configuration:
        return f"runs on {case.accelerator} with the class of {first.name} ({target}), covered with {first.name}"
    requires = registry.strategies.get(case.name).requires
    if requires is not None and Requirement(requires).name in _strategy_distributions():
        return (
            f"runs on {case.accelerator}, composed with the strategy of {requires}, whose checkpoints the matrix "
            "covers on the CPU; its runs on this accelerator are its own package's tests"
        )
    return None


def _strategy_distributions() -> set[str]:
    """The distributions that register strategies here."""
    distributions = set()
    for name in registry.strategies.names():
        try:
            distributions.add(registry.strategies.get(name).distribution)
        except ValueError:
            continue
    return distributions


def _first_case(name: str, accelerators: list[str]) -> tuple[StrategyCase | None, list[str]]:
    """``name`` on the first accelerator and the larger device count that resolve, or why none did."""
    reasons = []
    for accelerator in accelerators:
        for devices in (PARALLEL_DEVICES, 1):
            try:
                strategy = _resolve(name, accelerator, devices)
            except (ValueError, TypeError, RuntimeError, ImportError) as error:
                reasons.append(f"{accelerator}, devices={devices}: {error}")
                continue
            if isinstance(strategy, ParallelStrategy) != (devices > 1):
                continue
            registration = registry.strategies.get(name)
            options = sorted((k, repr(v)) for k, v in registration.defaults.items() if k not in LAUNCH_ONLY_OPTIONS)
            return StrategyCase(name, devices, (registration.target_path, repr(options)), accelerator), []
    return None, reasons


def distinct(cases: list[StrategyCase]) -> list[StrategyCase]:
    """One case per configuration (the first name registered for it)."""
    seen: dict[tuple[str, str], StrategyCase] = {}
    for case in cases:
        seen.setdefault(case.configuration, case)
    return list(seen.values())


def supported_precisions(case: StrategyCase) -> list[str]:
    """The registered precisions ``resolve`` accepts for this strategy on this machine."""
    accepted = []
    for precision in registry.precisions.names():
        try:
            _resolve(case.name, case.accelerator, case.devices, precision)
        except (ValueError, TypeError, ImportError):
            continue
        accepted.append(precision)
    return accepted
