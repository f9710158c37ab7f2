"""The cluster environment of XLA replicas: ordinals, world size and host index from the XLA runtime."""

from __future__ import annotations

import os
import sys

from stratagem.environments import ClusterEnvironment

WORLD_VARIABLES = ("PJRT_LOCAL_PROCESS_RANK", "TPU_WORKER_ID", "CLOUD_TPU_TASK_ID")
"""Variables that say this process belongs to a multi-process XLA world: set by ``xmp.spawn`` in each replica
(the first), or by a TPU VM for its host."""


class XLAEnvironment(ClusterEnvironment):
    """Ranks as the XLA runtime numbers its replicas (``xr.global_ordinal()``, ``xr.world_size()``, ...).

    The runtime is asked only once it runs in this process: before (in the process that creates the Trainer and
    starts the replicas), this process is rank 0 of the world stratagem computed, since asking would start the
    runtime there, after which ``xmp.spawn`` refuses to start replicas.
    """

    def __init__(self) -> None:
        self._world_size = 1

    @property
    def creates_processes_externally(self) -> bool:
        return False

    @property
    def main_address(self) -> str:
        if _runtime_started():
            import torch_xla.runtime as xr

            return str(xr.get_master_ip()) if xr.device_type() == "TPU" else "127.0.0.1"
        return "127.0.0.1"

    @property
    def main_port(self) -> int:
        # Replicas meet through the runtime (the "xla://" init method), not through a port stratagem chooses.
        return 0

    @staticmethod
    def detect() -> bool:
        return any(variable in os.environ for variable in WORLD_VARIABLES)

    def world_size(self) -> int:
        if _runtime_started():
            import torch_xla.runtime as xr

            return int(xr.world_size())
        return self._world_size

    def set_world_size(self, size: int) -> None:
        self._world_size = size

    def global_rank(self) -> int:
        if _runtime_started():
            import torch_xla.runtime as xr

            return int(xr.global_ordinal())
        return 0

    def local_rank(self) -> int:
        if _runtime_started():
            import torch_xla.runtime as xr

            return int(xr.local_ordinal())
        return 0

    def node_rank(self) -> int:
        if _runtime_started():
            import torch_xla.runtime as xr

            return int(xr.host_index())
        return 0


def _runtime_started() -> bool:
    from stratagem_xla import runtime

    if "torch_xla" not in sys.modules or runtime.xla_problem() is not None:
        return False
    import torch_xla

    return bool(torch_xla._XLAC._xla_runtime_is_initialized())
