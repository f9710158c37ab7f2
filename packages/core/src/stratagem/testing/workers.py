"""A pool of worker processes joined in one process group, reused across many checks.

Starting a process costs seconds (importing torch), so tests submit module-level functions
to one long-lived set of ranks instead of starting processes per check. A function that
fails or hangs on any rank ends the whole set; the next call starts a fresh one.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
import traceback
from collections.abc import Callable, Iterator
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

from stratagem.environments.local import find_free_port
from stratagem.strategies._backend_threads import wait_for_idle_gloo_workers


class WorkerError(RuntimeError):
    """A function failed on one or more ranks; the message carries each failing rank's traceback."""

    def __init__(self, failures: dict[int, str]) -> None:
        self.failures = failures
        details = "\n".join(f"--- rank {rank} ---\n{text}" for rank, text in sorted(failures.items()))
        super().__init__(f"failed on rank(s) {sorted(failures)}:\n{details}")


class DistributedWorkers:
    """``world_size`` spawned processes with an initialised ``torch.distributed`` group.

    ``run(fn, *args)`` calls ``fn(*args)`` on every rank and returns the results in rank
    order. ``fn`` must be importable by reference (defined at module level).
    """

    def __init__(
        self,
        world_size: int = 2,
        backend: str = "gloo",
        collective_timeout: float = 60.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.world_size = world_size
        self.backend = backend
        self.collective_timeout = collective_timeout
        self.env = dict(env or {})
        self._processes: list[multiprocessing.process.BaseProcess] = []
        self._connections: list[Connection] = []

    def run(self, function: Callable[..., Any], *args: Any, timeout: float = 120.0, **kwargs: Any) -> list[Any]:
        if not self._alive():
            self.start()
        for connection in self._connections:
            connection.send((function, args, kwargs))
        results: dict[int, Any] = {}
        failures: dict[int, str] = {}
        deadline = time.monotonic() + timeout
        pending = dict(enumerate(self._connections))
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            ready = multiprocessing.connection.wait(list(pending.values()), timeout=min(remaining, 1.0))
            for ready_connection in ready:
                rank = next(r for r, c in pending.items() if c is ready_connection)
                try:
                    status, payload = pending[rank].recv()
                except EOFError:
                    status, payload = "error", f"rank {rank} exited (code {self._processes[rank].exitcode})"
                del pending[rank]
                (results if status == "ok" else failures)[rank] = payload
            if failures and pending:
                # The others may be stuck in a collective with the failed rank: give them a moment.
                deadline = min(deadline, time.monotonic() + 5.0)
            for rank in list(pending):
                if not self._processes[rank].is_alive():
                    failures[rank] = f"rank {rank} died (exit code {self._processes[rank].exitcode})"
                    del pending[rank]
        if pending:
            for rank in pending:
                failures.setdefault(rank, f"rank {rank} did not finish within {timeout:.0f} s")
        if failures:
            self.close()
            raise WorkerError(failures)
        return [results[rank] for rank in range(self.world_size)]

    def start(self) -> None:
        self.close()
        context = multiprocessing.get_context("spawn")
        port = find_free_port()
        for rank in range(self.world_size):
            parent, child = context.Pipe()
            process = context.Process(
                target=_worker_main,
                args=(rank, self.world_size, port, self.backend, self.collective_timeout, self.env, child),
                daemon=True,
                name=f"stratagem-test-rank-{rank}",
            )
            process.start()
            child.close()
            self._processes.append(process)
            self._connections.append(parent)

    def close(self) -> None:
        for connection in self._connections:
            with contextlib.suppress(OSError):
                connection.send(None)
        for process in self._processes:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
        for connection in self._connections:
            connection.close()
        self._processes, self._connections = [], []

    def _alive(self) -> bool:
        return bool(self._processes) and all(process.is_alive() for process in self._processes)

    def __enter__(self) -> DistributedWorkers:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@contextlib.contextmanager
def distributed_workers(world_size: int = 2, **options: Any) -> Iterator[DistributedWorkers]:
    """``with distributed_workers(2) as workers: workers.run(fn)``; all processes end on exit."""
    workers = DistributedWorkers(world_size, **options)
    try:
        yield workers
    finally:
        workers.close()


def _worker_main(
    rank: int,
    world_size: int,
    port: int,
    backend: str,
    collective_timeout: float,
    env: dict[str, str],
    connection: Connection,
) -> None:
    os.environ.update(env)
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
        }
    )
    import torch.distributed as dist

    dist.init_process_group(
        backend,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=collective_timeout),
    )
    try:
        while True:
            try:
                task = connection.recv()
            except EOFError:
                return
            if task is None:
                return
            function, args, kwargs = task
            try:
                reply = ("ok", function(*args, **kwargs))
            except BaseException:
                reply = ("error", traceback.format_exc())
            connection.send(reply)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
            wait_for_idle_gloo_workers()
