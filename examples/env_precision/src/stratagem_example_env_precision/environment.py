"""A cluster environment for a scheduler that starts every rank itself and describes it in variables."""

from __future__ import annotations

import os

from stratagem.environments.cluster_environment import ClusterEnvironment

PREFIX = "EXAMPLE_SCHEDULER_"


class ExampleSchedulerEnvironment(ClusterEnvironment):
    """Reads ``EXAMPLE_SCHEDULER_{RANK,LOCAL_RANK,NODE_RANK,WORLD_SIZE,ADDR,PORT}``.

    :meth:`detect` looks only at the variables (it runs for every Trainer, whatever the plugin):
    it must not fail, import anything heavy or touch the network.
    """

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return os.environ.get(PREFIX + "ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        return _integer("PORT")

    @staticmethod
    def detect() -> bool:
        return all(PREFIX + name in os.environ for name in ("RANK", "WORLD_SIZE", "PORT"))

    def world_size(self) -> int:
        return _integer("WORLD_SIZE")

    def global_rank(self) -> int:
        return _integer("RANK")

    def local_rank(self) -> int:
        return int(os.environ.get(PREFIX + "LOCAL_RANK", "0"))

    def node_rank(self) -> int:
        return int(os.environ.get(PREFIX + "NODE_RANK", "0"))

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        if num_devices * num_nodes != self.world_size():
            raise ValueError(
                f"devices={num_devices} x num_nodes={num_nodes} does not match the {self.world_size()} ranks the "
                f"example scheduler started ({PREFIX}WORLD_SIZE); pass devices and num_nodes that multiply to it."
            )


def _integer(name: str) -> int:
    value = os.environ.get(PREFIX + name, "")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{PREFIX}{name}={value!r} is not an integer; the example scheduler sets it.") from None
