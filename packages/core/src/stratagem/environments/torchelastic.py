from __future__ import annotations

import os

from stratagem.environments._variables import (
    check_main_address,
    check_rank,
    port_variable,
    rank_variable,
    size_variable,
    str_variable,
)
from stratagem.environments.cluster_environment import ClusterEnvironment

_HINT = "torchrun sets it for every worker it starts."


class TorchElasticEnvironment(ClusterEnvironment):
    """Processes started by ``torchrun`` (``torch.distributed.run``), one per device.

    torchrun gives every worker ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``GROUP_RANK`` (the
    node's index), ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` and
    ``TORCHELASTIC_RUN_ID``; all of them are read from there, none is set by stratagem.
    """

    detected_by = ("TORCHELASTIC_RUN_ID", "RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK")

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return str_variable("MASTER_ADDR", hint=_HINT)

    @property
    def main_port(self) -> int:
        return port_variable("MASTER_PORT", hint=_HINT)

    @staticmethod
    def detect() -> bool:
        return all(name in os.environ for name in TorchElasticEnvironment.detected_by)

    @property
    def run_id(self) -> str:
        """torchrun's ``--rdzv-id``: the same on every worker of one job."""
        return os.environ.get("TORCHELASTIC_RUN_ID", "")

    @property
    def store_outlives_workers(self) -> bool:
        # torchrun hosts the store in its agent and keeps it across restarts (pytorch#135712), unless
        # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 makes worker rank 0 host a fresh one per attempt.
        return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)

    def world_size(self) -> int:
        return size_variable("WORLD_SIZE", hint=_HINT)

    def global_rank(self) -> int:
        return rank_variable("RANK", "WORLD_SIZE", hint=_HINT)

    def local_rank(self) -> int:
        return rank_variable("LOCAL_RANK", "LOCAL_WORLD_SIZE", hint=_HINT)

    def node_rank(self) -> int:
        return rank_variable("GROUP_RANK", "GROUP_WORLD_SIZE", hint=_HINT)

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        local_world_size = os.environ.get("LOCAL_WORLD_SIZE")
        if local_world_size is not None and size_variable("LOCAL_WORLD_SIZE", hint=_HINT) != num_devices:
            raise ValueError(
                f"torchrun started LOCAL_WORLD_SIZE={local_world_size} processes on this node, but devices="
                f"{num_devices}. Set devices={local_world_size}, or run torchrun --nproc-per-node={num_devices}."
            )
        world_size = self.world_size()
        if world_size != num_devices * num_nodes:
            raise ValueError(
                f"torchrun started WORLD_SIZE={world_size} processes, but devices={num_devices} x num_nodes="
                f"{num_nodes} = {num_devices * num_nodes}. Set num_nodes to torchrun's --nnodes and devices to "
                "its --nproc-per-node."
            )
        # Each variable is checked where it is read: read them all before anything starts.
        self.global_rank()
        check_rank("LOCAL_RANK", self.local_rank(), num_devices, f"devices={num_devices}", hint=_HINT)
        check_rank("GROUP_RANK", self.node_rank(), num_nodes, f"num_nodes={num_nodes}", hint=_HINT)
        _ = self.main_port
        check_main_address(self.main_address, must_resolve_now=self.node_rank() == 0)

    def __repr__(self) -> str:
        return f"TorchElasticEnvironment(run_id={self.run_id!r})"
