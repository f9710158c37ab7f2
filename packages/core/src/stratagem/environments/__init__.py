"""Cluster environments: where a process learns its rank, world size and rendezvous address."""

from stratagem.environments.cluster_environment import ClusterEnvironment
from stratagem.environments.local import LocalEnvironment

__all__ = ["ClusterEnvironment", "LocalEnvironment"]
