"""Ranks started by ``horovodrun --gloo``: the environment that reads the ``HOROVOD_*`` variables it sets.

horovodrun starts every rank and serves its own Gloo rendezvous; it does not say where a
``torch.distributed`` group (which stratagem's own collectives use) should meet, so, as for MPI,
``MASTER_ADDR`` (default ``127.0.0.1``, one node) and ``MASTER_PORT`` (default 29500) say it.
"""

from __future__ import annotations

import os

from stratagem.environments.cluster_environment import ClusterEnvironment

DEFAULT_PORT = 29500


class HorovodrunEnvironment(ClusterEnvironment):
    """Reads ``HOROVOD_RANK``, ``HOROVOD_SIZE``, ``HOROVOD_LOCAL_RANK`` and ``HOROVOD_CROSS_RANK``."""

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        return _integer("MASTER_PORT", str(DEFAULT_PORT))

    @staticmethod
    def detect() -> bool:
        return all(name in os.environ for name in ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_GLOO_RENDEZVOUS_ADDR"))

    def world_size(self) -> int:
        return _integer("HOROVOD_SIZE")

    def global_rank(self) -> int:
        return _integer("HOROVOD_RANK")

    def local_rank(self) -> int:
        return _integer("HOROVOD_LOCAL_RANK", "0")

    def node_rank(self) -> int:
        return _integer("HOROVOD_CROSS_RANK", "0")

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        if num_devices * num_nodes != self.world_size():
            raise ValueError(
                f"devices={num_devices} x num_nodes={num_nodes} does not match the {self.world_size()} ranks "
                "horovodrun started (HOROVOD_SIZE); pass devices and num_nodes that multiply to horovodrun's -np."
            )


def _integer(name: str, default: str | None = None) -> int:
    value = os.environ.get(name, default)
    try:
        return int(value or "")
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer; horovodrun sets it for every rank.") from None
