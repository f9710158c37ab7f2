"""Starting every local rank as a child of the calling process: spawn, fork or forkserver."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import sys
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from stratagem.environments.cluster_environment import ClusterEnvironment
from stratagem.launchers.failures import (
    RankFailedError,
    RankFailure,
    describe_exit,
    end_processes,
    exit_when_parent_dies,
    lead_own_process_group,
)
from stratagem.launchers.launcher import Launcher
from stratagem.launchers.rendezvous import check_main_port_free, rank_environment


class MultiprocessingLauncher(Launcher):
    """Starts ``num_processes`` ranks with ``multiprocessing`` and waits for them.

    The calling process is not a rank: ``function``'s return value on local rank 0 is
    pickled back to it. With ``"spawn"`` and ``"forkserver"``, ``function`` and its
    arguments must be picklable and the script needs an ``if __name__ == "__main__":``
    guard; ``"fork"`` needs neither and works in notebooks, but not after CUDA was
    initialised in the calling process.
    """

    def __init__(
        self,
        cluster_environment: ClusterEnvironment,
        num_processes: int,
        num_nodes: int,
        start_method: str = "spawn",
    ) -> None:
        available = multiprocessing.get_all_start_methods()
        if start_method not in available:
            raise ValueError(
                f"start_method={start_method!r} is not available on this platform; expected one of {available}."
            )
        self.cluster_environment = cluster_environment
        self.num_processes = num_processes
        self.num_nodes = num_nodes
        self.start_method = start_method

    @property
    def is_interactive_compatible(self) -> bool:
        # Spawned processes re-import __main__, which a notebook does not have as a file.
        return self.start_method == "fork"

    @property
    def caller_is_worker(self) -> bool:
        return False

    def launch(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.start_method == "fork":
            _check_cuda_not_initialized()
        else:
            _check_main_importable(self.start_method)
        check_main_port_free(self.cluster_environment)
        context: Any = multiprocessing.get_context(self.start_method)
        first_rank = self.cluster_environment.node_rank() * self.num_processes
        ranks: dict[int, _Rank] = {}
        try:
            for local_rank in range(self.num_processes):
                reader, writer = context.Pipe(duplex=False)
                environment = rank_environment(self.cluster_environment, local_rank, self.num_processes, self.num_nodes)
                process = context.Process(
                    target=_run_rank,
                    args=(first_rank + local_rank, environment, os.getpid(), writer, function, args, kwargs),
                    name=f"stratagem-rank-{first_rank + local_rank}",
                )
                process.start()
                writer.close()
                ranks[first_rank + local_rank] = _Rank(process, reader)
            return _supervise(ranks, result_rank=first_rank)
        finally:
            end_processes([rank.process for rank in ranks.values()])
            for rank in ranks.values():
                rank.connection.close()

    def __repr__(self) -> str:
        return (
            f"MultiprocessingLauncher(start_method={self.start_method!r}, num_processes={self.num_processes}, "
            f"num_nodes={self.num_nodes})"
        )


def _check_main_importable(start_method: str) -> None:
    """A spawned rank re-imports ``__main__`` to find the functions and classes it is sent; without a main
    module it can import (a notebook, ``python -c``, a script read from standard input) every rank would
    fail with an error about a missing file or attribute."""
    main = sys.modules.get("__main__")
    if getattr(getattr(main, "__spec__", None), "name", None) is not None:
        return
    path = getattr(main, "__file__", None)
    if path is not None and Path(path).is_file():
        return
    where = "has no file" if path is None else f"is {path!r}, which is not a file"
    raise RuntimeError(
        f"start_method={start_method!r} starts each rank by re-importing your main module, and this session's "
        f"__main__ {where} (a notebook, 'python -c' or a script read from standard input). Use 'ddp_notebook' or "
        "'ddp_fork' there (they fork, importing nothing), or run a script file."
    )


FAILURE_GRACE_SECONDS = 2.0
"""After a rank fails, how long the others get to report a failure of their own that came first."""


class _Rank:
    def __init__(self, process: BaseProcess, connection: Connection) -> None:
        self.process = process
        self.connection = connection
        self.report: tuple[Any, ...] | None = None


def _supervise(ranks: dict[int, _Rank], result_rank: int) -> Any:
    """Wait until every rank finished; on the first failure, return at once with an error."""
    running = dict(ranks)
    while running:
        failures = _failures_of_finished(running, timeout=None, count_reported_errors=False)
        if failures:
            # The rank that failed first is the cause; its report may still be on its way while a
            # peer's consequential error (a closed connection) arrived first.
            failures += _failures_within_grace(running)
            raise RankFailedError(*_cause_first(failures))
    report = ranks[result_rank].report
    assert report is not None
    return pickle.loads(report[1])


def _failures_of_finished(
    running: dict[int, _Rank], timeout: float | None, count_reported_errors: bool
) -> list[tuple[RankFailure, float]]:
    """Wait up to ``timeout`` for ranks to report or exit; remove those that finished from ``running``
    and return their failures. With ``count_reported_errors``, a rank that reported an error counts
    as finished before its process has exited."""
    waitables: dict[Any, int] = {}
    for rank, state in running.items():
        if state.report is None and not state.connection.closed:
            waitables[state.connection] = rank
        waitables[state.process.sentinel] = rank
    failures: list[tuple[RankFailure, float]] = []
    for rank in sorted({waitables[item] for item in wait(list(waitables), timeout)}):
        state = running[rank]
        _receive_report(state)
        reported_error = count_reported_errors and state.report is not None and state.report[0] == "error"
        if state.process.is_alive() and not reported_error:
            continue
        if not state.process.is_alive():
            state.process.join()
        failure = _failure_of(rank, state)
        if failure is not None:
            failures.append(failure)
        del running[rank]
    return failures


def _failures_within_grace(running: dict[int, _Rank]) -> list[tuple[RankFailure, float]]:
    late: list[tuple[RankFailure, float]] = []
    deadline = time.monotonic() + FAILURE_GRACE_SECONDS
    while running and (remaining := deadline - time.monotonic()) > 0:
        late += _failures_of_finished(running, timeout=remaining, count_reported_errors=True)
    return late


def _cause_first(failures: list[tuple[RankFailure, float]]) -> tuple[RankFailure, list[RankFailure]]:
    # A rank killed without a report is the likelier cause of a peer's error in the same moment;
    # among ranks that reported, the earliest failure came first.
    ordered = sorted(failures, key=lambda item: (item[0].traceback_text is not None, item[1]))
    return ordered[0][0], [failure for failure, _ in ordered[1:]]


def _receive_report(state: _Rank) -> None:
    if state.report is not None or state.connection.closed:
        return
    try:
        if state.connection.poll():
            state.report = pickle.loads(state.connection.recv_bytes())
    except (EOFError, OSError):
        state.connection.close()


def _failure_of(rank: int, state: _Rank) -> tuple[RankFailure, float] | None:
    """The rank's failure and when it happened (now, for a rank that died without reporting)."""
    if state.report is not None and state.report[0] == "error":
        _, traceback_text, failed_at = state.report
        return RankFailure(rank, state.process.pid, "raised an exception", traceback_text), failed_at
    exitcode = state.process.exitcode
    assert exitcode is not None
    if state.report is None or exitcode != 0:
        reason = describe_exit(exitcode) + ("" if state.report is None else " after finishing")
        return RankFailure(rank, state.process.pid, reason), time.time()
    return None


def _run_rank(
    rank: int,
    environment: dict[str, str],
    parent_pid: int,
    connection: Connection,
    function: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> None:
    lead_own_process_group()
    os.environ.update(environment)
    exit_when_parent_dies(parent_pid, who=f"rank {rank}")
    try:
        result = function(*args, **kwargs)
        returned = result if environment["LOCAL_RANK"] == "0" else None
        payload = pickle.dumps(("ok", pickle.dumps(returned)))
    except BaseException:
        connection.send_bytes(pickle.dumps(("error", traceback.format_exc(), time.time())))
        connection.close()
        sys.exit(1)
    connection.send_bytes(payload)
    connection.close()


def _check_cuda_not_initialized() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise RuntimeError(
            "CUDA was initialised in this process before forking, and a forked process cannot use it. Use a "
            "strategy that spawns (e.g. 'ddp_spawn') or re-runs the script ('ddp'), or do not touch CUDA "
            "before fit."
        )
