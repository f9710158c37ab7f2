from __future__ import annotations

import os
from dataclasses import dataclass

from stratagem.environments._variables import (
    check_main_address,
    port_variable,
    rank_variable,
    size_variable,
)
from stratagem.environments.cluster_environment import ClusterEnvironment

DEFAULT_PORT = 29500
"""The rendezvous port when ``MASTER_PORT`` is unset (torch.distributed's usual default)."""


@dataclass(frozen=True)
class MPIFlavour:
    """Where one MPI implementation's launcher puts a rank's place in the job."""

    name: str
    rank: str
    size: str
    local_rank: str
    local_size: str
    hint: str


FLAVOURS: tuple[MPIFlavour, ...] = (
    MPIFlavour(
        "Open MPI",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "Open MPI's mpirun sets it for every rank.",
    ),
    MPIFlavour(
        "MPICH / Intel MPI (Hydra)",
        "PMI_RANK",
        "PMI_SIZE",
        "MPI_LOCALRANKID",
        "MPI_LOCALNRANKS",
        "mpiexec sets it for every rank.",
    ),
    # A bare PMIx launcher (prun, prterun) exports only the rank; the sizes are the user's to export.
    MPIFlavour(
        "PMIx",
        "PMIX_RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "A PMIx launcher exports only PMIX_RANK: export WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE yourself.",
    ),
)
"""Checked in this order; Open MPI also sets ``PMIX_RANK``, so it must come before PMIx."""


class MPIEnvironment(ClusterEnvironment):
    """Ranks started by ``mpirun`` / ``mpiexec``, one per device, read without mpi4py.

    Open MPI (``OMPI_COMM_WORLD_*``), MPICH and Intel MPI (``PMI_RANK``, ``PMI_SIZE``,
    ``MPI_LOCALRANKID``, ``MPI_LOCALNRANKS``) and bare PMIx launchers (``PMIX_RANK``, with
    ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` exported by the user) are read.
    A node's rank is ``global rank // ranks per node``: ranks are assumed to fill one node
    after the other, as ``mpirun --map-by ppr:N:node`` places them.

    MPI does not tell a rank where rank 0 runs, so a job spanning several nodes needs
    ``MASTER_ADDR`` exported to every rank (``mpirun -x MASTER_ADDR=$(hostname) ...``); on
    one node it defaults to ``127.0.0.1``. ``MASTER_PORT`` defaults to 29500.
    """

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def flavour(self) -> MPIFlavour:
        flavour = detected_flavour()
        if flavour is None:
            names = ", ".join(flavour.rank for flavour in FLAVOURS)
            raise ValueError(f"No MPI launcher variable ({names}) is set: this process was not started by mpirun.")
        return flavour

    @property
    def main_address(self) -> str:
        return self._rendezvous_host()

    def _rendezvous_host(self) -> str:
        if os.environ.get("MASTER_ADDR"):
            return os.environ["MASTER_ADDR"]
        if self._local_size() == self.world_size():
            return "127.0.0.1"
        raise ValueError(
            f"This {self.flavour.name} job spans several nodes, and MPI does not tell a rank where rank 0 runs: "
            "export MASTER_ADDR (the host of rank 0) to every rank, e.g. mpirun -x MASTER_ADDR=$(hostname) ... "
            "with Open MPI or mpiexec -genv MASTER_ADDR $(hostname) ... with MPICH / Intel MPI."
        )

    @property
    def main_port(self) -> int:
        return port_variable("MASTER_PORT", DEFAULT_PORT)

    @staticmethod
    def detect() -> bool:
        return detected_flavour() is not None

    def world_size(self) -> int:
        return size_variable(self.flavour.size, hint=self.flavour.hint)

    def global_rank(self) -> int:
        flavour = self.flavour
        return rank_variable(flavour.rank, flavour.size, hint=flavour.hint)

    def local_rank(self) -> int:
        flavour = self.flavour
        return rank_variable(flavour.local_rank, flavour.local_size, hint=flavour.hint)

    def node_rank(self) -> int:
        return self.global_rank() // self._local_size()

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        flavour = self.flavour
        local_size = self._local_size()
        if local_size != num_devices:
            raise ValueError(
                f"{flavour.name} started {flavour.local_size}={local_size} rank(s) on this node, but devices="
                f"{num_devices}. Start one rank per device (e.g. mpirun --map-by ppr:{num_devices}:node) or set "
                f"devices={local_size}."
            )
        world_size = self.world_size()
        if world_size != num_devices * num_nodes:
            raise ValueError(
                f"{flavour.name} started {flavour.size}={world_size} ranks, but devices={num_devices} x num_nodes="
                f"{num_nodes} = {num_devices * num_nodes}. Set num_nodes={world_size // num_devices} or start "
                f"{num_devices * num_nodes} ranks."
            )
        # Each variable is checked where it is read: read them all before anything starts (MASTER_ADDR too,
        # which a job across nodes needs).
        self.global_rank()
        self.local_rank()
        _ = self.main_port
        check_main_address(
            self._rendezvous_host(), derived_from="the loopback address", must_resolve_now=self.node_rank() == 0
        )

    def _local_size(self) -> int:
        return size_variable(self.flavour.local_size, hint=self.flavour.hint)

    def __repr__(self) -> str:
        flavour = detected_flavour()
        return f"MPIEnvironment(flavour={flavour.name if flavour else None!r})"


def detected_flavour() -> MPIFlavour | None:
    """The MPI implementation whose launcher started this process, if any."""
    return next((flavour for flavour in FLAVOURS if flavour.rank in os.environ), None)
