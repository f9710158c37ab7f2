"""Starting swarm peers as separate processes, the way a user starts them in terminals, and reading what they did."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

PEER_SCRIPT = Path(__file__).with_name("peer.py")
JOIN_LINE = re.compile(r"STRATAGEM_HIVEMIND_INITIAL_PEERS=(\S+)")
LOCALHOST = ["/ip4/127.0.0.1/tcp/0"]
SWARM = {"matchmaking_time": 5.0, "averaging_timeout": 30.0, "host_maddrs": LOCALHOST}
"""The strategy's default rounds, on localhost. Shorter ones lose rounds ("could not find a group") when the
machine is busy, and peers that lose a round step on their own gradients."""


STARTED: list[subprocess.Popen[bytes]] = []
"""Every process a test started, so that ``conftest.py`` ends those a failing test left running."""


class Peer:
    """One ``peer.py`` process; its output goes to ``directory / "peer.log"``."""

    def __init__(self, directory: Path, options: dict[str, Any], steps: int, data_seed: int, step_delay: float):
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.log = directory / "peer.log"
        command = [
            sys.executable,
            str(PEER_SCRIPT),
            str(directory),
            json.dumps({**SWARM, **options}),
            f"--steps={steps}",
            f"--data-seed={data_seed}",
            f"--step-delay={step_delay}",
        ]
        environment = {**os.environ, "OMP_NUM_THREADS": "1"}
        environment.pop("STRATAGEM_HIVEMIND_INITIAL_PEERS", None)
        environment.pop("STRATAGEM_HIVEMIND_MIN_PEERS", None)
        with self.log.open("w") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environment)
        STARTED.append(self.process)

    def join_address(self, timeout: float = 120.0) -> str:
        """The addresses the peer printed for others to join it at."""
        return wait_for(lambda: _first_match(self.log), timeout, f"{self.log} to print the join line")

    def progress(self) -> dict[str, Any]:
        path = self.directory / "progress.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def finish(self, timeout: float = 240.0) -> dict[str, Any]:
        """Wait for the peer to exit; its result (raises with its log if it failed)."""
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"peer {self.directory.name} did not finish in {timeout} s:\n{self.tail()}") from None
        if code != 0:
            raise AssertionError(f"peer {self.directory.name} exited with {code}:\n{self.tail()}")
        result: dict[str, Any] = json.loads((self.directory / "result.json").read_text())
        return result

    def epochs(self) -> dict[int, dict[str, torch.Tensor]]:
        """The weights this peer held at each collaborative epoch it reached."""
        loaded: dict[int, dict[str, torch.Tensor]] = torch.load(self.directory / "epochs.pt", weights_only=True)
        return loaded

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()

    def tail(self) -> str:
        return self.log.read_text()[-6000:] if self.log.exists() else "(no log)"


def _first_match(log: Path) -> str | None:
    if not log.exists():
        return None
    found = JOIN_LINE.search(log.read_text())
    return found.group(1) if found else None


def wait_for(condition: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def largest_difference(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> float:
    return max((first[key] - second[key]).abs().max().item() for key in first)
