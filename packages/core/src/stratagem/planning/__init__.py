"""Planning: estimate what training a module needs per rank under each strategy, and choose one that fits."""

from stratagem.planning.footprint import model_footprint
from stratagem.planning.planner import SAFETY_MARGIN, Candidate, Plan, judge, plan, strategies_to_plan
from stratagem.planning.resources import Resources, host_memory_bytes, visible_resources

__all__ = [
    "SAFETY_MARGIN",
    "Candidate",
    "Plan",
    "Resources",
    "host_memory_bytes",
    "judge",
    "model_footprint",
    "plan",
    "strategies_to_plan",
    "visible_resources",
]
