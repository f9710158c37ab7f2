"""Helpers for testing strategies: a reusable set of ranks with a real process group."""

from stratagem.testing.cuda import cuda_device_count, requires_cuda
from stratagem.testing.processes import processes_with_variable, wait_until_no_process_has
from stratagem.testing.workers import DistributedWorkers, WorkerError, distributed_workers

__all__ = [
    "DistributedWorkers",
    "WorkerError",
    "cuda_device_count",
    "distributed_workers",
    "processes_with_variable",
    "requires_cuda",
    "wait_until_no_process_has",
]
