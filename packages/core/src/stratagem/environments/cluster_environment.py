"""The ClusterEnvironment interface: where a process learns its place in the job."""

from __future__ import annotations

from abc import ABC, abstractmethod


class ClusterEnvironment(ABC):
    """What a cluster (or torchrun, or the user's shell) tells a process about the job.

    Ranks and world size are read from the environment the scheduler set. The local
    environment is the one exception: it has no scheduler, so the launcher sets ranks on it.
    """

    @property
    @abstractmethod
    def creates_processes_externally(self) -> bool:
        """Whether something outside stratagem (torchrun, srun, mpirun) starts every rank."""

    @property
    @abstractmethod
    def main_address(self) -> str:
        """Address of the rank-0 host, for the process-group rendezvous."""

    @property
    @abstractmethod
    def main_port(self) -> int:
        """Port of the process-group rendezvous on :attr:`main_address`."""

    @staticmethod
    @abstractmethod
    def detect() -> bool:
        """Whether the current process runs inside this environment (from its variables only)."""

    @abstractmethod
    def world_size(self) -> int:
        """Number of processes in the job."""

    @abstractmethod
    def global_rank(self) -> int:
        """Rank of this process among all processes."""

    @abstractmethod
    def local_rank(self) -> int:
        """Rank of this process on its node."""

    @abstractmethod
    def node_rank(self) -> int:
        """Index of this process's node."""

    @property
    def attempt(self) -> str:
        """Which attempt of the job this process belongs to, where a scheduler restarts every rank and
        the new ranks meet in the same rendezvous store as the failed ones (torchrun's
        ``--max-restarts``): the process group's keys are namespaced by it, so that a restarted rank
        never reads the address of a rank that died."""
        return "0"

    def set_world_size(self, size: int) -> None:
        """Record the world size computed by stratagem; ignored where the scheduler sets it."""

    def set_global_rank(self, rank: int) -> None:
        """Record the rank computed by stratagem; ignored where the scheduler sets it."""

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Raise ``ValueError`` if the Trainer's ``devices``/``num_nodes`` contradict the job."""

    def teardown(self) -> None:
        """Undo changes made to the process environment."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
