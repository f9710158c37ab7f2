"""The Logger interface: where metrics go (a CSV file, TensorBoard, ...)."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any


class Logger(ABC):
    """Receives metrics from the Trainer on the global-zero process only.

    Files are created lazily, on first write, so that constructing a logger (in every rank,
    or in a caller that spawns workers) touches nothing on disk.
    """

    @abstractmethod
    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Record ``metrics`` (name to value) at optimizer step ``step``."""

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        """Record the run's hyperparameters."""

    def save(self) -> None:
        """Write out anything buffered."""

    def finalize(self, status: str) -> None:
        """Called at the end of a run (``status`` is ``"success"`` or ``"failed"``); flush and close."""
        self.save()

    @property
    def log_dir(self) -> str | None:
        """The directory this logger writes into, or ``None`` when it writes no files."""
        return None

    def adopt_version(self, version: int) -> None:
        """Offered on global zero when a fit gets its checkpoint directory ``checkpoints/version_<version>``.

        A logger that numbers its directories takes the number, so that one run's logs and checkpoints
        share it, unless it was given a version, has chosen one, or that directory exists already.
        """


class VersionedDirectory:
    """``save_dir/name/version_N``: ``N`` is the next free number, chosen on first use."""

    def __init__(self, save_dir: str | Path, name: str, version: int | str | None) -> None:
        self.save_dir = Path(save_dir)
        self.name = name
        self._version = version

    @property
    def version(self) -> int | str:
        if self._version is None:
            self._version = next_version(self.save_dir / self.name)
        return self._version

    @version.setter
    def version(self, version: int | str) -> None:
        self._version = version

    def adopt(self, version: int) -> None:
        """Take ``version`` if none is chosen yet and its directory can be created now (not there before)."""
        if self._version is not None:
            return
        try:
            (self.save_dir / self.name / f"version_{version}").mkdir(parents=True)
        except FileExistsError:
            return
        self._version = version

    @property
    def path(self) -> Path:
        version = self.version
        return self.save_dir / self.name / (f"version_{version}" if isinstance(version, int) else version)


def next_version(root: Path) -> int:
    """One more than the highest ``version_N`` directory under ``root`` (0 when there is none)."""
    if not root.is_dir():
        return 0
    numbers = [int(match.group(1)) for entry in root.iterdir() if (match := re.fullmatch(r"version_(\d+)", entry.name))]
    return max(numbers, default=-1) + 1


def claim_next_version(root: Path) -> int:
    """Create the next free ``root/version_N`` and return ``N``; two processes never get the same ``N``.

    ``mkdir`` either creates the directory or fails because it exists, in one step, so a run that
    loses the race for a number takes the next.
    """
    root.mkdir(parents=True, exist_ok=True)
    version = next_version(root)
    while True:
        try:
            (root / f"version_{version}").mkdir()
        except FileExistsError:
            version += 1
            continue
        return version
