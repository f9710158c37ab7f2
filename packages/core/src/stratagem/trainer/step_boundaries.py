"""Telling a strategy where a step ends: the one place :class:`~stratagem.strategies.StepBoundaryListener` is
looked at. The loops get the callable once, before their first batch, and call it without asking again."""

from __future__ import annotations

from collections.abc import Callable

from stratagem.strategies import StepBoundary, StepBoundaryListener, Strategy


def step_boundary_callback(strategy: Strategy) -> Callable[[StepBoundary], None] | None:
    """What the loops call at each step boundary: the strategy's listener, or ``None`` when it has none (the
    loops then skip the call, which on small models costs a measurable share of a step)."""
    if isinstance(strategy, StepBoundaryListener):
        return strategy.at_step_boundary
    return None
