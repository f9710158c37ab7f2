"""Finding the processes a test started, to check that none is left behind."""

from __future__ import annotations

import os
import time
from pathlib import Path


def processes_with_variable(name: str, value: str) -> list[int]:
    """Pids of this user's live processes whose environment has ``name=value`` (Linux ``/proc``).

    A test sets a unique value on the job it starts; every process of the job inherits it.
    """
    marker = f"{name}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            variables = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in variables and state != "Z":
            found.append(int(entry.name))
    return found


def wait_until_no_process_has(name: str, value: str, timeout: float = 10.0) -> list[int]:
    """Wait up to ``timeout`` s for the processes with ``name=value`` to end; return those still alive."""
    deadline = time.monotonic() + timeout
    while True:
        alive = processes_with_variable(name, value)
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.1)
