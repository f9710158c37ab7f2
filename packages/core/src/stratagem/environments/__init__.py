"""Cluster environments: where a process learns its rank, world size and rendezvous address.

Which environment a run uses is decided by :func:`stratagem.connector.detect_environment`,
which asks each registered environment's ``detect()`` in this order and takes the first yes:

1. environments registered by plugins (they are the more specific);
2. ``torchelastic`` - torchrun started this process (checked before the schedulers, because
   torchrun is often run inside a SLURM, LSF or Kubeflow job and then owns the ranks);
3. ``slurm`` - srun started this task (not in an interactive ``bash``/``interactive`` job);
4. ``lsf`` - jsrun started this rank;
5. ``mpi`` - mpirun / mpiexec started this rank (Open MPI, MPICH, Intel MPI, PMIx);
6. ``kubeflow`` - a Kubeflow PyTorchJob pod;
7. ``local`` - none of these: one machine, or nodes started by hand.

``plugins=[...]`` in ``stratagem.resolve`` / ``Trainer`` overrides detection. Every environment
checks the user's ``devices`` and ``num_nodes`` against the job in ``validate_settings``, and reads
each variable through ``_variables``, which refuses a value that cannot work (a rank outside its
size, a port outside 1-65535) naming the variable, before any process starts.
"""

from stratagem.environments.cluster_environment import ClusterEnvironment
from stratagem.environments.kubeflow import KubeflowEnvironment
from stratagem.environments.local import LocalEnvironment
from stratagem.environments.lsf import LSFEnvironment
from stratagem.environments.mpi import MPIEnvironment
from stratagem.environments.slurm import SLURMEnvironment
from stratagem.environments.torchelastic import TorchElasticEnvironment

__all__ = [
    "ClusterEnvironment",
    "KubeflowEnvironment",
    "LSFEnvironment",
    "LocalEnvironment",
    "MPIEnvironment",
    "SLURMEnvironment",
    "TorchElasticEnvironment",
]
