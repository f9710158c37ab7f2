"""Which strategies and precisions the matrix covers, read from the registries of what is installed.

Nothing here names a strategy: a package joins the matrix by registering names. A name that
cannot run on this machine is kept with the reason ``resolve`` gives, so that the test
report says why it was left out instead of leaving it out silently.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import stratagem
from stratagem import registry
from stratagem.strategies import ParallelStrategy

ACCELERATOR = "cpu"
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

    @property
    def parallel(self) -> bool:
        return self.devices > 1


def _resolve(name: str, devices: int, precision: str = "32-true") -> stratagem.strategies.Strategy:
    saved = {variable: os.environ.pop(variable) for variable in list(os.environ) if variable in _LAUNCH_VARIABLES}
    try:
        return stratagem.resolve(strategy=name, accelerator=ACCELERATOR, devices=devices, precision=precision)
    finally:
        os.environ.update(saved)


_LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "GROUP_RANK", "SLURM_NTASKS")


def discover() -> tuple[list[StrategyCase], dict[str, str]]:
    """Every registered strategy: the ones that run here, and why each other one does not."""
    runnable: list[StrategyCase] = []
    refused: dict[str, str] = {}
    for name in registry.strategies.names():
        reasons = []
        for devices in (PARALLEL_DEVICES, 1):
            try:
                strategy = _resolve(name, devices)
            except (ValueError, TypeError, RuntimeError, ImportError) as error:
                reasons.append(f"devices={devices}: {error}")
                continue
            if isinstance(strategy, ParallelStrategy) != (devices > 1):
                continue
            registration = registry.strategies.get(name)
            options = sorted((k, repr(v)) for k, v in registration.defaults.items() if k not in LAUNCH_ONLY_OPTIONS)
            runnable.append(StrategyCase(name, devices, (registration.target_path, repr(options))))
            break
        else:
            refused[name] = " | ".join(reasons)
    return runnable, refused


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
            _resolve(case.name, case.devices, precision)
        except (ValueError, TypeError):
            continue
        accepted.append(precision)
    return accepted
