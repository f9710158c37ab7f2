from __future__ import annotations

import os
import socket

from stratagem.environments._variables import (
    check_main_address,
    check_rank,
    first_set,
    int_variable,
    port_variable,
    rank_variable,
    size_variable,
)
from stratagem.environments.cluster_environment import ClusterEnvironment


class LocalEnvironment(ClusterEnvironment):
    """No scheduler: one machine, or several started by hand with the same command.

    Reads ``MASTER_ADDR`` (default ``127.0.0.1``), ``MASTER_PORT`` (default: a free port,
    chosen once and exported so that child processes agree), ``NODE_RANK`` and
    ``LOCAL_RANK``. ``WORLD_SIZE`` and the global rank come from the strategy
    (``devices * num_nodes``); a ``WORLD_SIZE`` in the environment must agree with them.

    ``LOCAL_RANK`` set means this process is one rank of several started by hand (or by
    stratagem's own launcher), which then also sets ``WORLD_SIZE`` and ``MASTER_PORT`` so that
    the ranks can meet. A ``LOCAL_RANK`` without them, where several processes are needed, is a
    leftover in the shell: it is refused, because this process would wait for peers nobody starts.
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
        return os.environ.get("MASTER_ADDR") or "127.0.0.1"

    @property
    def main_port(self) -> int:
        if "MASTER_PORT" not in os.environ:
            os.environ["MASTER_PORT"] = str(find_free_port())
        return port_variable("MASTER_PORT")

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
        return int_variable("LOCAL_RANK", 0, minimum=0)

    def node_rank(self) -> int:
        name = first_set("NODE_RANK", "GROUP_RANK")
        return 0 if name is None else rank_variable(name)

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        node_variable = first_set("NODE_RANK", "GROUP_RANK")
        if node_variable is not None:
            check_rank(node_variable, self.node_rank(), num_nodes, f"num_nodes={num_nodes}")
        if "WORLD_SIZE" in os.environ and size_variable("WORLD_SIZE") != num_devices * num_nodes:
            raise ValueError(
                f"WORLD_SIZE={os.environ['WORLD_SIZE']} in the environment, but devices={num_devices} x "
                f"num_nodes={num_nodes} = {num_devices * num_nodes} processes."
            )
        if num_nodes > 1 and not os.environ.get("MASTER_ADDR"):
            raise ValueError(
                f"num_nodes={num_nodes} without a cluster scheduler needs MASTER_ADDR (the address of node 0) "
                "and MASTER_PORT set on every node, and NODE_RANK on each."
            )
        if "MASTER_PORT" in os.environ:
            port_variable("MASTER_PORT")
        if "LOCAL_RANK" in os.environ:
            self._check_started_by_hand(num_devices, num_nodes)
        if os.environ.get("MASTER_ADDR"):
            check_main_address(self.main_address, must_resolve_now=self.node_rank() == 0)

    def _check_started_by_hand(self, num_devices: int, num_nodes: int) -> None:
        check_rank("LOCAL_RANK", self.local_rank(), num_devices, f"devices={num_devices}")
        missing = [name for name in ("WORLD_SIZE", "MASTER_PORT") if name not in os.environ]
        if missing and num_devices * num_nodes > 1:
            raise ValueError(
                f"The environment variable LOCAL_RANK={os.environ['LOCAL_RANK']!r} is set, which means this process "
                f"is one of {num_devices * num_nodes} ranks started by hand, but {' and '.join(missing)} "
                f"{'is' if len(missing) == 1 else 'are'} not, so its peers could never meet it. If LOCAL_RANK is "
                "left over in your shell, unset it (`unset LOCAL_RANK`) and stratagem starts the ranks; if you "
                "start every rank yourself, set WORLD_SIZE and the same MASTER_PORT in each."
            )


def find_free_port() -> int:
    """A TCP port that was free a moment ago on this host."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
