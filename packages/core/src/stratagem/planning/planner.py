"""Choose the fastest strategy whose estimated peak fits this machine; explain the choice in one line."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from torch import nn

from stratagem.planning.footprint import model_footprint
from stratagem.planning.resources import Resources, visible_resources
from stratagem.strategies.capabilities import ChecksModuleBeforeLaunch
from stratagem.strategies.memory import MemoryEstimate, ModelFootprint
from stratagem.strategies.strategy import Strategy

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from stratagem.connector import WiringOptions

SAFETY_MARGIN = 0.85
"""The share of the visible memory and disk an estimated peak may use: estimates are rough."""

GIB = 1024**3


@dataclass(frozen=True)
class Candidate:
    """One strategy as the planner judged it."""

    name: str
    estimate: MemoryEstimate | None = None
    processes_per_machine: int = 1
    device_is_host: bool = True
    problem: str | None = None
    """Why it cannot run here (it did not resolve) or does not fit; ``None`` when it fits."""

    @property
    def fits(self) -> bool:
        return self.estimate is not None and self.problem is None

    @property
    def memory_per_rank(self) -> int:
        """Bytes one rank needs in the memory its device lives in (host memory on the CPU)."""
        return self.estimate.memory_bytes(self.device_is_host) if self.estimate is not None else 0


@dataclass(frozen=True)
class Plan:
    """The footprint, what each strategy would need, and the choice."""

    footprint: ModelFootprint
    resources: Resources
    candidates: list[Candidate]
    notes: list[str] = field(default_factory=list)

    @property
    def chosen(self) -> Candidate | None:
        """The fitting candidate with the smallest declared step time (earlier candidates win ties)."""
        fitting = [candidate for candidate in self.candidates if candidate.fits]
        if not fitting:
            return None
        return min(fitting, key=lambda candidate: candidate.estimate.relative_step_time)  # type: ignore[union-attr]

    def reason(self) -> str:
        """One line: what was chosen, what it needs per rank, and what the first candidate would have needed."""
        chosen = self.chosen
        first = self.candidates[0]
        if chosen is None:
            usable = [candidate for candidate in self.candidates if candidate.estimate is not None]
            smallest = min(usable, key=lambda candidate: candidate.memory_per_rank, default=None)
            tried = ""
            if smallest is not None:
                tried = f"; the smallest, {smallest.name}, needs {size_text(smallest.memory_per_rank)} per rank"
            return f"no strategy fits {size_text(self.resources.host_memory_bytes)} of available memory{tried}"
        line = f"auto → {chosen.name}: {size_text(chosen.memory_per_rank)} needed per rank"
        if chosen is first:
            return f"{line}, {size_text(self._room(chosen))} available"
        return f"{line}, {first.name} would need {size_text(first.memory_per_rank)}"

    def _room(self, candidate: Candidate) -> int:
        if candidate.device_is_host or self.resources.device_memory_bytes is None:
            return self.resources.host_memory_bytes // candidate.processes_per_machine
        return self.resources.device_memory_bytes


def plan(
    module: nn.Module,
    strategies: Sequence[str | Strategy],
    *,
    resources: Resources | None = None,
    first_fit: bool = False,
    **options: Unpack[WiringOptions],
) -> Plan:
    """Estimate what each of ``strategies`` (names or unconfigured instances), resolved with ``options`` (as
    :func:`~stratagem.resolve` takes them), would need per rank to train ``module``, and which fit ``resources``
    (default: what this machine shows now).

    ``first_fit=True`` stops at the first candidate that fits (``strategy="auto"`` passes its default first,
    so that the usual case resolves nothing more).
    """
    from stratagem.connector import resolve
    from stratagem.registry import PluginError

    candidates: list[Candidate] = []
    footprint: ModelFootprint | None = None
    notes: list[str] = []
    for requested in strategies:
        name = requested if isinstance(requested, str) else type(requested).__name__
        try:
            strategy = resolve(strategy=requested, **options)
        except (ValueError, TypeError, ImportError, RuntimeError, PluginError) as error:
            candidates.append(Candidate(name, problem=f"not usable here: {error}"))
            continue
        if footprint is None:
            footprint, notes = model_footprint(module, strategy.precision)
        if resources is None:
            resources = visible_resources(strategy.root_device)
        try:
            # A strategy the module's structure cannot serve (a pipeline without blocks to cut) is no candidate.
            if isinstance(strategy, ChecksModuleBeforeLaunch):
                strategy.check_module(module, "fit")
            candidate = judge(name, strategy, footprint, resources, options.get("num_nodes", 1))
        except (ValueError, TypeError) as error:
            candidate = Candidate(name, problem=f"not usable for {type(module).__name__}: {error}")
        candidates.append(candidate)
        if first_fit and candidate.fits:
            break
    if footprint is None or resources is None:
        problems = "; ".join(f"{candidate.name}: {candidate.problem}" for candidate in candidates)
        raise ValueError(f"No strategy could be configured to plan with: {problems}")
    return Plan(footprint, resources, candidates, notes)


def judge(name: str, strategy: Strategy, footprint: ModelFootprint, resources: Resources, num_nodes: int) -> Candidate:
    """Whether ``strategy`` (configured) fits ``resources`` with the safety margin."""
    estimate = strategy.estimate_memory(footprint)
    processes = max(1, strategy.world_size // num_nodes)
    device_is_host = strategy.root_device.type == "cpu" or resources.device_memory_bytes is None
    limits = []
    if device_is_host:
        host_need = (estimate.device_bytes + estimate.host_bytes + resources.process_bytes) * processes
    else:
        host_need = (estimate.host_bytes + resources.process_bytes) * processes
        assert resources.device_memory_bytes is not None
        limits.append(("device memory per rank", estimate.device_bytes, resources.device_memory_bytes))
    limits.append(("host memory", host_need, resources.host_memory_bytes))
    limits.append(("disk", estimate.disk_bytes * processes, resources.disk_bytes))
    problems = [
        f"needs {size_text(need)} of {what}, {size_text(have)} available"
        for what, need, have in limits
        if need > SAFETY_MARGIN * have
    ]
    return Candidate(
        name,
        estimate,
        processes_per_machine=processes,
        device_is_host=device_is_host,
        problem="; ".join(problems) or None,
    )


def strategies_to_plan(default: str, registered: Iterable[str]) -> list[str]:
    """``default`` first, then every other registered name in registration order."""
    return [default, *(name for name in registered if name != default)]


def size_text(value: float) -> str:
    """``value`` bytes in GiB, or MiB below one GiB."""
    return f"{value / GIB:.1f} GiB" if value >= GIB else f"{value / 1024**2:.1f} MiB"
