"""Telling a strategy where a step ends: the one place :class:`~stratagem.strategies.StepBoundaryListener` is
looked at. The loops get the callable once, before their first batch, and call it without asking again."""

from __future__ import annotations

from collections.abc import Callable

from stratagem.strategies import StepBoundary, StepBoundaryListener, Strategy


def step_boundary_callback(strategy: Strategy) -> Callable[[StepBoundary], None]:
    """What the loops call at each step boundary: the strategy's listener, or nothing."""
    if isinstance(strategy, StepBoundaryListener):
        return strategy.at_step_boundary
    return _no_listener


def _no_listener(boundary: StepBoundary) -> None:
    pass
