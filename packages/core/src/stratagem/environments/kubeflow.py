from __future__ import annotations

import os

from stratagem.environments._variables import (
    check_rank,
    port_variable,
    rank_variable,
    size_variable,
    str_variable,
)
from stratagem.environments.cluster_environment import ClusterEnvironment

_HINT = "The Kubeflow training operator sets it in every PyTorchJob pod."


class KubeflowEnvironment(ClusterEnvironment):
    """A Kubeflow PyTorchJob in which each pod runs the training script once (one process per pod).

    The training operator gives every pod ``MASTER_ADDR``/``MASTER_PORT`` (the master pod's
    service), ``RANK`` and ``WORLD_SIZE``. ``RANK`` is always the pod's index. ``WORLD_SIZE``
    is not: older operator releases set it to the number of pods, and releases that know
    ``nprocPerNode`` set it to pods x processes per pod, adding ``PET_NNODES`` and
    ``PET_NPROC_PER_NODE`` for torchrun. stratagem counts pods, which is what it needs here:
    ``PET_NNODES`` when it is a number, else ``WORLD_SIZE / PET_NPROC_PER_NODE``, else
    ``WORLD_SIZE``. Each pod is one node with one process, so ``devices=1`` and ``num_nodes``
    is the number of pods. For several processes per pod run ``torchrun`` as the pod's command;
    its variables are detected first (see :mod:`stratagem.environments`).
    """

    detected_by = ("KUBERNETES_PORT", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")

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
        return all(name in os.environ for name in KubeflowEnvironment.detected_by)

    def world_size(self) -> int:
        return self.pod_count()

    def global_rank(self) -> int:
        pods, source = self._pods()
        rank = rank_variable("RANK", hint=_HINT)
        check_rank("RANK", rank, pods, f"the job's {pods} pod(s) ({source})", hint=_HINT)
        return rank

    def local_rank(self) -> int:
        return 0

    def node_rank(self) -> int:
        return self.global_rank()

    def pod_count(self) -> int:
        """The number of pods in the job (see the class docstring for how it is read)."""
        return self._pods()[0]

    def _pods(self) -> tuple[int, str]:
        """The number of pods, and the variables it was read from (for messages)."""
        nodes = os.environ.get("PET_NNODES", "")
        # PET_NNODES is a range such as "1:4" in an elastic job; the pods are then counted from WORLD_SIZE.
        if nodes.isdigit() and int(nodes) > 0:
            return int(nodes), f"PET_NNODES={nodes}"
        world_size = size_variable("WORLD_SIZE", hint=_HINT)
        per_pod = os.environ.get("PET_NPROC_PER_NODE", "")
        if not (per_pod.isdigit() and int(per_pod) > 0):
            return world_size, f"WORLD_SIZE={world_size}"
        if world_size % int(per_pod):
            raise ValueError(
                f"The environment variable WORLD_SIZE={world_size} is not a multiple of PET_NPROC_PER_NODE={per_pod}. "
                f"{_HINT}"
            )
        return world_size // int(per_pod), f"WORLD_SIZE={world_size} / PET_NPROC_PER_NODE={per_pod}"

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        if num_devices != 1:
            raise ValueError(
                f"devices={num_devices}, but a Kubeflow PyTorchJob pod that runs the script directly is one "
                f"process. Run "
                f"`torchrun --nproc-per-node={num_devices} <script>` as the pod's command (stratagem then reads "
                "torchrun's variables), or set devices=1."
            )
        pods = self.pod_count()
        if pods != num_nodes:
            raise ValueError(
                f"The Kubeflow PyTorchJob has {pods} pod(s), but num_nodes={num_nodes}. Set num_nodes={pods} "
                "(one node per pod)."
            )
        # Each variable is checked where it is read: read them all before anything starts. MASTER_ADDR is not
        # resolved here: the master pod's service name may only enter DNS once that pod runs.
        self.global_rank()
        _ = self.main_address, self.main_port

    def __repr__(self) -> str:
        return f"KubeflowEnvironment(pod={os.environ.get('RANK')!r})"
