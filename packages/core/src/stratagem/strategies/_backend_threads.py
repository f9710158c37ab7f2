"""Waiting for Gloo's worker threads to let go of finished collectives before the process may exit.

A Gloo worker thread releases a collective's tensors after the caller's ``wait()`` has returned,
and releasing a tensor that Python knows takes the GIL. When that happens while the interpreter
is finalizing, the thread cannot take the GIL, and the whole process aborts with "terminate
called without an active exception" (pytorch#190489). A rank that trained correctly then exits
with SIGABRT, which the launcher rightly reports as a failed rank. Destroying the process group
does not stop those threads (once DDP or FSDP has used the group, its C++ object outlives
``destroy_process_group`` and even the wrapped module), so the only safe point is to wait until
they are idle.

PyTorch 2.13 names those workers ``pt_gloo_runloop``; 2.9 leaves them with the name every thread
inherits from the process (``python``), like the process's own Python threads. Where no thread
carries Gloo's names, every thread with the inherited name except the caller is waited for: an idle
Python thread is seen asleep at once, so this costs nothing more than the observations.
"""

from __future__ import annotations

import os
import threading
import time

_GLOO_WORKER_THREAD_NAME = "pt_gloo_runloop"
_GLOO_THREAD_NAMES = frozenset({_GLOO_WORKER_THREAD_NAME, "gloo_tcp_loop"})
_SETTLE_INTERVAL_SECONDS = 0.002
_IDLE_OBSERVATIONS_REQUIRED = 2


def wait_for_idle_gloo_workers(timeout: float = 2.0) -> bool:
    """Return once every Gloo worker thread of this process has been seen asleep twice in a row.

    Between observations the GIL is free, so a worker waiting for it gets it and is seen running
    instead. Returns False when the workers were still busy at ``timeout`` (or when threads cannot
    be observed on this platform, after one settle interval).
    """
    workers = _gloo_worker_threads()
    if workers is None:
        time.sleep(_SETTLE_INTERVAL_SECONDS)
        return False
    deadline = time.monotonic() + timeout
    idle_in_a_row = 0
    while workers and idle_in_a_row < _IDLE_OBSERVATIONS_REQUIRED:
        if time.monotonic() > deadline:
            return False
        time.sleep(_SETTLE_INTERVAL_SECONDS)
        idle_in_a_row = idle_in_a_row + 1 if all(_is_asleep(thread) for thread in workers) else 0
    return True


def _gloo_worker_threads() -> list[str] | None:
    """Thread ids of this process's Gloo workers; None where /proc does not show threads."""
    names = _thread_names()
    if names is None:
        return None
    if _GLOO_THREAD_NAMES & set(names.values()):
        return [thread for thread, name in names.items() if name == _GLOO_WORKER_THREAD_NAME]
    inherited = names.get(str(os.getpid()))
    caller = str(threading.get_native_id())
    return [thread for thread, name in names.items() if name == inherited and thread != caller]


def _thread_names() -> dict[str, str] | None:
    try:
        threads = os.listdir("/proc/self/task")
    except OSError:
        return None
    names = {}
    for thread in threads:
        try:
            with open(f"/proc/self/task/{thread}/comm") as comm:
                names[thread] = comm.read().strip()
        except OSError:
            continue
    return names


def _is_asleep(thread: str) -> bool:
    try:
        with open(f"/proc/self/task/{thread}/stat") as stat:
            fields = stat.read()
    except OSError:
        return True
    # The command name in parentheses may itself contain spaces; the state follows it.
    state = fields[fields.rindex(")") + 2]
    return state in "SD"
