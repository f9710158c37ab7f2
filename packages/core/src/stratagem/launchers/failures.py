"""How a failed rank is reported, and how the ranks of a failed run are ended."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.process import BaseProcess

from stratagem.printable import printable

TRACEBACK_CHARACTERS = 20_000
"""How much of a failed rank's traceback (its last characters) the error shows."""

END_GRACE_SECONDS = 5.0
"""How long an ended rank gets to exit after SIGTERM before it is sent SIGKILL."""


@dataclass(frozen=True)
class RankFailure:
    """One rank that raised, crashed or was killed."""

    rank: int
    pid: int | None
    reason: str
    traceback_text: str | None = None

    def summary(self) -> str:
        where = f"rank {self.rank}" + (f" (pid {self.pid})" if self.pid is not None else "")
        return f"{where} {self.reason}"


class RankFailedError(RuntimeError):
    """A rank of a launched run failed; every other rank was ended.

    ``failure`` is the first rank that failed (the cause); ``others`` are ranks that failed
    after it, usually because their peer went away.
    """

    def __init__(self, failure: RankFailure, others: Sequence[RankFailure] = ()) -> None:
        self.failure = failure
        self.others = tuple(others)
        super().__init__(_failure_message(failure, self.others))

    @property
    def rank(self) -> int:
        return self.failure.rank

    def __reduce__(self) -> tuple[type[RankFailedError], tuple[RankFailure, tuple[RankFailure, ...]]]:
        return type(self), (self.failure, self.others)


def _failure_message(failure: RankFailure, others: Sequence[RankFailure]) -> str:
    lines = [f"{failure.summary()}; every other rank was ended."]
    if failure.traceback_text:
        # The traceback is read from a file; its end says most.
        traceback_text = printable(failure.traceback_text.rstrip(), TRACEBACK_CHARACTERS, keep_newlines=True, tail=True)
        lines += [f"--- traceback of rank {failure.rank} ---", traceback_text]
    else:
        lines.append(f"(rank {failure.rank} left no Python traceback; its own output above may say more.)")
    for other in others:
        last_line = (other.traceback_text or "").strip().splitlines()[-1:] or [""]
        lines.append(f"Also failed after it: {other.summary()}. {printable(last_line[0], 300)}".rstrip())
    return "\n".join(lines)


def describe_exit(returncode: int) -> str:
    """``'was killed by SIGKILL'`` or ``'exited with code 1'`` for a process's return code."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with code {returncode}"


def lead_own_process_group() -> None:
    """Make this rank the leader of a new session and process group, as torchrun does for its workers.

    Ending a rank then ends what it started (DataLoader workers) with it, and on Linux with
    autogroup scheduling each rank gets its own share of a busy machine's CPUs. Ctrl-C in a
    terminal reaches only the launching process, which ends the ranks.
    """
    if hasattr(os, "setsid"):
        os.setsid()


def end_processes(processes: Sequence[subprocess.Popen[bytes] | BaseProcess], grace: float = END_GRACE_SECONDS) -> None:
    """SIGTERM every live process, SIGKILL those still alive after ``grace`` seconds, and reap them all."""
    for process in processes:
        if _is_alive(process):
            _signal(process, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(_is_alive(p) for p in processes) and time.monotonic() < deadline:
        time.sleep(0.05)
    for process in processes:
        if _is_alive(process):
            _signal(process, signal.SIGKILL)
    for process in processes:
        if isinstance(process, subprocess.Popen):
            process.wait()
        else:
            process.join()


def exit_when_parent_dies(parent_pid: int, who: str, interval: float = 0.5) -> None:
    """End this process soon after ``parent_pid`` (the launching process) is gone.

    A launching process that is killed (SIGKILL) cannot end its ranks; each rank watches it
    instead, so that none is left behind.
    """

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval)
        print(
            f"stratagem: {who} is ending because its launching process (pid {parent_pid}) is gone.",
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)

    threading.Thread(target=watch, name="stratagem-parent-watch", daemon=True).start()


def _is_alive(process: subprocess.Popen[bytes] | BaseProcess) -> bool:
    if isinstance(process, subprocess.Popen):
        return process.poll() is None
    return process.is_alive()


def _signal(process: subprocess.Popen[bytes] | BaseProcess, signum: signal.Signals) -> None:
    if process.pid is None:
        return
    try:
        if hasattr(os, "killpg") and os.getpgid(process.pid) == process.pid:
            os.killpg(process.pid, signum)
        else:
            os.kill(process.pid, signum)
    except ProcessLookupError:
        pass
