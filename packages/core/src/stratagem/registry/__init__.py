"""The registries: one per kind of plugin, filled from built-ins and entry points on first use."""

from stratagem.registry import _builtins
from stratagem.registry.registry import (
    Description,
    PluginProblem,
    Registration,
    Registry,
    requirement_problem,
)

strategies = Registry("strategy", "stratagem.strategies", _builtins.register_strategies)
accelerators = Registry("accelerator", "stratagem.accelerators", _builtins.register_accelerators)
precisions = Registry("precision", "stratagem.precisions", _builtins.register_precisions)
environments = Registry("environment", "stratagem.environments", _builtins.register_environments)
checkpoint_io = Registry("checkpoint IO", "stratagem.checkpoint_io", _builtins.register_checkpoint_io)

ALL: tuple[Registry, ...] = (strategies, accelerators, precisions, environments, checkpoint_io)

__all__ = [
    "ALL",
    "Description",
    "PluginProblem",
    "Registration",
    "Registry",
    "accelerators",
    "checkpoint_io",
    "environments",
    "precisions",
    "requirement_problem",
    "strategies",
]
