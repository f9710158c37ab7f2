"""Choosing a launcher by name: the ``start_method`` option any parallel strategy can offer."""

from __future__ import annotations

import multiprocessing

from stratagem.environments.cluster_environment import ClusterEnvironment
from stratagem.launchers.in_process import InProcessLauncher
from stratagem.launchers.launcher import Launcher
from stratagem.launchers.multiprocessing_launcher import MultiprocessingLauncher
from stratagem.launchers.subprocess_launcher import SubprocessLauncher

START_METHODS: tuple[str, ...] = ("popen", "spawn", "fork", "forkserver")
"""``"popen"`` re-runs the user's command per rank (:class:`SubprocessLauncher`); the others
start ranks with ``multiprocessing`` (:class:`MultiprocessingLauncher`)."""


def check_start_method(start_method: object, option: str = "start_method") -> str:
    """Return ``start_method`` if it names a launcher usable on this platform, else raise naming ``option``."""
    if not isinstance(start_method, str) or start_method not in START_METHODS:
        raise ValueError(
            f"{option}={start_method!r} is not valid; expected one of {', '.join(map(repr, START_METHODS))}."
        )
    if start_method != "popen" and start_method not in multiprocessing.get_all_start_methods():
        usable = ["popen", *multiprocessing.get_all_start_methods()]
        raise ValueError(
            f"{option}={start_method!r} is not available on this platform; use one of {', '.join(map(repr, usable))}."
        )
    return start_method


def create_launcher(
    start_method: str, cluster_environment: ClusterEnvironment, num_processes: int, num_nodes: int
) -> Launcher:
    """The launcher that starts ``num_processes`` local ranks of a ``num_nodes``-node job with ``start_method``.

    Where something else already started every rank (torchrun, srun, mpirun), each process
    runs as the rank it is, whatever ``start_method`` says.
    """
    check_start_method(start_method)
    if start_method == "popen":
        # Also the path of the ranks it starts itself, which must know they were started.
        return SubprocessLauncher(cluster_environment, num_processes, num_nodes)
    if cluster_environment.creates_processes_externally:
        return InProcessLauncher()
    return MultiprocessingLauncher(cluster_environment, num_processes, num_nodes, start_method)
