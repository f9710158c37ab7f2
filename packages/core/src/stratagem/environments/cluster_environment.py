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
    def store_outlives_workers(self) -> bool:
        """Whether the rendezvous store at :attr:`main_address` is hosted outside the ranks and kept when they
        are restarted (torchrun's agent store): the ranks of a new attempt then meet among keys the failed
        attempt left, and tell them apart by a handshake."""
        return False

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
