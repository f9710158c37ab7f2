"""TensorBoardLogger: metrics as TensorBoard scalars (needs the ``tensorboard`` package)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stratagem.loggers.logger import Logger, VersionedDirectory

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

INSTALL_HINT = 'pip install "stratagem[tensorboard]" (or pip install tensorboard)'


def tensorboard_available() -> bool:
    return importlib.util.find_spec("tensorboard") is not None


class TensorBoardLogger(Logger):
    """Writes event files to ``<save_dir>/<name>/version_<N>/``; view them with ``tensorboard --logdir``."""

    def __init__(self, save_dir: str | Path = ".", name: str = "tensorboard_logs", version: int | str | None = None):
        if not tensorboard_available():
            raise ValueError(
                f"logger='tensorboard' needs the tensorboard package, which is not installed: {INSTALL_HINT}."
            )
        self._directory = VersionedDirectory(save_dir, name, version)
        self._writer: SummaryWriter | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_writer"] = None
        return state

    @property
    def version(self) -> int | str:
        return self._directory.version

    @version.setter
    def version(self, version: int | str) -> None:
        self._directory.version = version

    def adopt_version(self, version: int) -> None:
        self._directory.adopt(version)

    @property
    def log_dir(self) -> str:
        return str(self._directory.path)

    @property
    def writer(self) -> SummaryWriter:
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=self.log_dir)
        return self._writer

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, global_step=step)

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        self.writer.add_text("hyperparameters", "\n".join(f"{key}: {value}" for key, value in params.items()))

    def save(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def finalize(self, status: str) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
