from __future__ import annotations

import os
import socket

from stratagem.environments._variables import int_variable
from stratagem.environments.cluster_environment import ClusterEnvironment


class LocalEnvironment(ClusterEnvironment):
    """No scheduler: one machine, or several started by hand with the same command.

    Reads ``MASTER_ADDR`` (default ``127.0.0.1``), ``MASTER_PORT`` (default: a free port,
    chosen once and exported so that child processes agree), ``NODE_RANK`` and
    ``LOCAL_RANK``. ``WORLD_SIZE`` and the global rank come from the strategy
    (``devices * num_nodes``); a ``WORLD_SIZE`` in the environment must agree with them.
    """

    def __init__(self) -> None:
        self._world_size = 1
        self._global_rank = 0

    @property
    def creates_processes_externally(self) -> bool:
        # A LOCAL_RANK already set means the user (or a launcher) started every process.
        return "LOCAL_RANK" in os.environ

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        if "MASTER_PORT" not in os.environ:
            os.environ["MASTER_PORT"] = str(find_free_port())
        return int_variable("MASTER_PORT")

    @staticmethod
    def detect() -> bool:
        return True

    def world_size(self) -> int:
        return self._world_size

    def set_world_size(self, size: int) -> None:
        self._world_size = size

    def global_rank(self) -> int:
        return self._global_rank

    def set_global_rank(self, rank: int) -> None:
        self._global_rank = rank

    def local_rank(self) -> int:
        return int_variable("LOCAL_RANK", 0)

    def node_rank(self) -> int:
        for name in ("NODE_RANK", "GROUP_RANK"):
            if name in os.environ:
                return int_variable(name)
        return 0

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        node_rank = self.node_rank()
        if not 0 <= node_rank < num_nodes:
            raise ValueError(f"NODE_RANK={node_rank} is outside num_nodes={num_nodes}; expected 0..{num_nodes - 1}.")
        if "WORLD_SIZE" in os.environ and int_variable("WORLD_SIZE") != num_devices * num_nodes:
            raise ValueError(
                f"WORLD_SIZE={os.environ['WORLD_SIZE']} in the environment, but devices={num_devices} x "
                f"num_nodes={num_nodes} = {num_devices * num_nodes} processes."
            )
        if num_nodes > 1 and "MASTER_ADDR" not in os.environ:
            raise ValueError(
                f"num_nodes={num_nodes} without a cluster scheduler needs MASTER_ADDR (the address of node 0) "
                "and MASTER_PORT set on every node, and NODE_RANK on each."
            )


def find_free_port() -> int:
    """A TCP port that was free a moment ago on this host."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
