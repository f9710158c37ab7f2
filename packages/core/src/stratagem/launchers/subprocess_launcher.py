"""Re-running the user's command once per extra local rank, like torchrun; the caller is rank 0."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from stratagem.environments.cluster_environment import ClusterEnvironment
from stratagem.launchers.failures import (
    RankFailedError,
    RankFailure,
    describe_exit,
    end_processes,
    exit_when_parent_dies,
)
from stratagem.launchers.launcher import Launcher
from stratagem.launchers.rendezvous import check_main_port_free, rank_environment
from stratagem.printable import printable

PARENT_PID_VARIABLE = "STRATAGEM_LAUNCHER_PARENT_PID"
"""Set in the ranks this launcher starts: the pid of rank 0, which they watch."""

ERROR_FILE_VARIABLE = "STRATAGEM_LAUNCHER_ERROR_FILE"
"""Set in the ranks this launcher starts: where a rank writes its traceback when it fails."""

MAIN_THREAD_GRACE_SECONDS = 15.0
"""After a rank failed, how long rank 0 gets to stop by itself before it is made to exit."""


class SubprocessLauncher(Launcher):
    """Starts local ranks ``1..num_processes-1`` by re-running this process's command line.

    Works for ``python script.py ...``, ``python -m package ...`` and console scripts: the
    command is ``sys.executable`` followed by the interpreter's original arguments. Each
    rank re-runs the whole script and finds ``LOCAL_RANK`` set, so its strategy's cluster
    environment reports ``creates_processes_externally`` and this launcher only runs the
    function there. The started ranks live as long as rank 0's script: at exit, rank 0 waits
    for them. When a rank fails, the others are ended and rank 0 raises
    :class:`~stratagem.launchers.failures.RankFailedError` naming it.
    """

    def __init__(self, cluster_environment: ClusterEnvironment, num_processes: int, num_nodes: int) -> None:
        self.cluster_environment = cluster_environment
        self.num_processes = num_processes
        self.num_nodes = num_nodes

    @property
    def is_interactive_compatible(self) -> bool:
        return False

    @property
    def caller_is_worker(self) -> bool:
        return True

    def launch(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if _started_ranks is not None:
            return _started_ranks.run_as_rank_zero(function, args, kwargs)
        if self.cluster_environment.creates_processes_externally:
            return _run_as_started_rank(function, args, kwargs)
        command = _command_to_rerun()
        check_main_port_free(self.cluster_environment)
        os.environ.update(rank_environment(self.cluster_environment, 0, self.num_processes, self.num_nodes))
        if self.num_processes == 1:
            return function(*args, **kwargs)
        ranks = _start_ranks(command, self.cluster_environment, self.num_processes, self.num_nodes)
        return ranks.run_as_rank_zero(function, args, kwargs)

    def __repr__(self) -> str:
        return f"SubprocessLauncher(num_processes={self.num_processes}, num_nodes={self.num_nodes})"


class _StartedRanks:
    """The ranks this process started. They re-run the whole script, so they outlive one launch."""

    def __init__(
        self, own_rank: int, processes: dict[int, subprocess.Popen[bytes]], error_files: dict[int, Path], workdir: Path
    ) -> None:
        self.own_rank = own_rank
        self.processes = processes
        self.error_files = error_files
        self.workdir = workdir
        self._lock = threading.Lock()
        self._failure: RankFailure | None = None
        self._failure_raised = False
        self._ended = False
        self._rank_zero_stopped = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="stratagem-rank-watch", daemon=True)
        self._watcher.start()

    def run_as_rank_zero(self, function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self._raise_if_failed()
        if self._ended:
            raise RuntimeError(
                "The other ranks of this script were ended after an earlier failure; a new run needs them. "
                "Start the script again."
            )
        try:
            result = function(*args, **kwargs)
        except KeyboardInterrupt:
            self.end()
            raise
        except BaseException as error:
            # Rank 0's own error is often the consequence of another rank dying (a closed
            # connection); that death is then already visible, or within moments.
            failure = self._failure_of_others(wait=1.0)
            if failure is None:
                print(
                    f"stratagem: rank {self.own_rank} failed ({type(error).__name__}); ending the other ranks.",
                    file=sys.stderr,
                    flush=True,
                )
                self.end()
                raise
            self._raise_failure(failure, cause=error)
        self._raise_if_failed()
        return result

    def end(self) -> None:
        """End every started rank; they are not waited for or reported at exit."""
        with self._lock:
            self._ended = True
        end_processes(list(self.processes.values()))

    def wait_at_exit(self) -> None:
        """Wait for the started ranks to finish their scripts; report and exit non-zero if one fails."""
        self._rank_zero_stopped.set()
        self._watcher.join()
        try:
            if getattr(sys, "last_value", None) is not None and not self._ended:
                print(f"stratagem: rank {self.own_rank} failed; ending the other ranks.", file=sys.stderr, flush=True)
                self.end()
            while True:
                failure = self._failure or self._poll_failure()
                if failure is not None and not self._failure_raised:
                    self._record(failure)
                    print(f"stratagem: {RankFailedError(failure)}", file=sys.stderr, flush=True)
                    os._exit(1)
                if self._ended or all(process.poll() is not None for process in self.processes.values()):
                    return
                time.sleep(0.1)
        except KeyboardInterrupt:
            self.end()
            raise
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _watch(self) -> None:
        while not self._rank_zero_stopped.wait(0.2):
            failure = None if self._ended else self._poll_failure()
            if failure is None:
                continue
            self._record(failure)
            if self._rank_zero_stopped.wait(MAIN_THREAD_GRACE_SECONDS):
                return
            # Rank 0 neither raised nor finished: it is busy where no peer can reach it, or
            # blocked inside a collective.
            print(
                f"stratagem: {RankFailedError(failure)}\nstratagem: rank {self.own_rank} did not stop within "
                f"{MAIN_THREAD_GRACE_SECONDS:.0f} s; exiting.",
                file=sys.stderr,
                flush=True,
            )
            os._exit(1)

    def _record(self, failure: RankFailure) -> None:
        with self._lock:
            if self._failure is None:
                self._failure = failure
        self.end()

    def _raise_if_failed(self) -> None:
        failure = self._failure or self._poll_failure()
        if failure is not None:
            self._raise_failure(failure, cause=None)

    def _raise_failure(self, failure: RankFailure, cause: BaseException | None) -> NoReturn:
        self._record(failure)
        self._failure_raised = True
        self._rank_zero_stopped.set()
        raise RankFailedError(self._failure or failure) from cause

    def _failure_of_others(self, wait: float) -> RankFailure | None:
        deadline = time.monotonic() + wait
        while True:
            failure = self._failure or self._poll_failure()
            if failure is not None or time.monotonic() >= deadline:
                return failure
            time.sleep(0.05)

    def _poll_failure(self) -> RankFailure | None:
        if self._ended:
            return None
        for rank, process in self.processes.items():
            returncode = process.poll()
            if returncode is not None and returncode != 0:
                return RankFailure(rank, process.pid, describe_exit(returncode), _read(self.error_files[rank]))
        return None


_started_ranks: _StartedRanks | None = None


def _start_ranks(
    command: list[str], cluster_environment: ClusterEnvironment, num_processes: int, num_nodes: int
) -> _StartedRanks:
    global _started_ranks
    workdir = Path(tempfile.mkdtemp(prefix="stratagem-ranks-"))
    first_rank = cluster_environment.node_rank() * num_processes
    processes: dict[int, subprocess.Popen[bytes]] = {}
    error_files: dict[int, Path] = {}
    for local_rank in range(1, num_processes):
        rank = first_rank + local_rank
        error_files[rank] = workdir / f"rank-{rank}.traceback"
        environment = {
            **os.environ,
            **rank_environment(cluster_environment, local_rank, num_processes, num_nodes),
            PARENT_PID_VARIABLE: str(os.getpid()),
            ERROR_FILE_VARIABLE: str(error_files[rank]),
        }
        # Its own session and process group, as lead_own_process_group() explains.
        processes[rank] = subprocess.Popen(command, env=environment, start_new_session=True)
    _started_ranks = _StartedRanks(first_rank, processes, error_files, workdir)
    atexit.register(_started_ranks.wait_at_exit)
    return _started_ranks


def _run_as_started_rank(function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """In a rank started by this launcher (or by torchrun, SLURM ...): run, and leave a traceback on failure."""
    parent_pid = os.environ.get(PARENT_PID_VARIABLE)
    if parent_pid is not None:
        _watch_parent_once(int(parent_pid))
    try:
        return function(*args, **kwargs)
    except BaseException:
        error_file = os.environ.get(ERROR_FILE_VARIABLE)
        if error_file:
            _leave_traceback(Path(error_file), traceback.format_exc())
        raise


def _leave_traceback(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, which must not exist yet: the launcher names a fresh file in a directory of its
    own, so an existing one means the variable was inherited from elsewhere (left set in a torchrun job, say)
    and that file is not ours to replace. Never raises: the rank's own error is what matters."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError as error:
        reason = "it exists already" if isinstance(error, FileExistsError) else f"{error.strerror}"
        print(
            f"stratagem: not writing this rank's traceback to {ERROR_FILE_VARIABLE}={printable(repr(str(path)))}: "
            f"{reason}, and stratagem only creates a new file there (the launcher that starts ranks sets the "
            "variable to a fresh path). Unset it if it was left over from another job.",
            file=sys.stderr,
            flush=True,
        )
        return
    with os.fdopen(descriptor, "w") as file:
        file.write(text)


_parent_watched = False


def _watch_parent_once(parent_pid: int) -> None:
    global _parent_watched
    if not _parent_watched:
        _parent_watched = True
        exit_when_parent_dies(parent_pid, who=f"local rank {os.environ.get('LOCAL_RANK', '?')}")


def _command_to_rerun() -> list[str]:
    arguments = list(sys.orig_argv[1:])
    if not arguments or arguments[-1] == "-" or (len(arguments) == 1 and arguments[0].startswith("-")):
        raise RuntimeError(
            f"This strategy starts its ranks by re-running your command ({' '.join(sys.orig_argv)!r}), which "
            "cannot be re-run (an interactive session or a script read from standard input). Run a script file "
            "or 'python -m package', or use a strategy that forks or spawns (e.g. 'ddp_fork', 'ddp_spawn')."
        )
    return [sys.executable, *arguments]


def _read(path: Path) -> str | None:
    try:
        return path.read_text() or None
    except OSError:
        return None
