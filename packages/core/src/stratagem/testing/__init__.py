"""Helpers for testing strategies: a reusable set of ranks with a real process group."""

from stratagem.testing.workers import DistributedWorkers, WorkerError, distributed_workers

__all__ = ["DistributedWorkers", "WorkerError", "distributed_workers"]
