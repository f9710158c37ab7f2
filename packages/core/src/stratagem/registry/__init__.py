"""The registries: one per kind of plugin, filled from built-ins and entry points on first use."""

from stratagem.registry import _builtins
from stratagem.registry.registry import (
    Description,
    PluginError,
    PluginProblem,
    Registration,
    Registry,
    requirement_problem,
    unknown_group_problems,
)

strategies = Registry(
    "strategy",
    "stratagem.strategies",
    _builtins.register_strategies,
    interface="stratagem.strategies.strategy:Strategy",
)
accelerators = Registry(
    "accelerator",
    "stratagem.accelerators",
    _builtins.register_accelerators,
    interface="stratagem.accelerators.accelerator:Accelerator",
)
precisions = Registry(
    "precision",
    "stratagem.precisions",
    _builtins.register_precisions,
    interface="stratagem.precision.precision:Precision",
)
environments = Registry(
    "environment",
    "stratagem.environments",
    _builtins.register_environments,
    interface="stratagem.environments.cluster_environment:ClusterEnvironment",
)
checkpoint_io = Registry(
    "checkpoint IO",
    "stratagem.checkpoint_io",
    _builtins.register_checkpoint_io,
    interface="stratagem.checkpoint_io.checkpoint_io:CheckpointIO",
)

ALL: tuple[Registry, ...] = (strategies, accelerators, precisions, environments, checkpoint_io)

__all__ = [
    "ALL",
    "Description",
    "PluginError",
    "PluginProblem",
    "Registration",
    "Registry",
    "accelerators",
    "checkpoint_io",
    "environments",
    "precisions",
    "requirement_problem",
    "strategies",
    "unknown_group_problems",
]
