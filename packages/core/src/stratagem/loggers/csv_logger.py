"""CSVLogger: metrics as rows of ``metrics.csv`` (one column per metric)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from stratagem.loggers.logger import Logger, VersionedDirectory


class CSVLogger(Logger):
    """Writes ``<save_dir>/<name>/version_<N>/metrics.csv``: a ``step`` column, then one per metric.

    Rows are buffered and written every ``flush_every_n_rows`` rows and at the end of a run;
    when a new metric appears the file is rewritten with the wider header.
    """

    def __init__(
        self,
        save_dir: str | Path = ".",
        name: str = "csv_logs",
        version: int | str | None = None,
        flush_every_n_rows: int = 100,
    ) -> None:
        self._directory = VersionedDirectory(save_dir, name, version)
        self.flush_every_n_rows = flush_every_n_rows
        self._columns: list[str] = []
        self._pending: list[dict[str, Any]] = []

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
    def metrics_file(self) -> Path:
        return self._directory.path / "metrics.csv"

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self._pending.append({"step": step, **metrics})
        if len(self._pending) >= self.flush_every_n_rows:
            self.save()

    def save(self) -> None:
        if not self._pending:
            return
        path = self.metrics_file
        path.parent.mkdir(parents=True, exist_ok=True)
        if not self._columns and path.exists():
            # Another run (or process) wrote this version before: continue its file.
            with path.open(newline="") as stream:
                self._columns = list(csv.DictReader(stream).fieldnames or [])
        columns = list(self._columns) or ["step"]
        for row in self._pending:
            columns.extend(key for key in row if key not in columns)
        rows = self._pending
        if path.exists() and columns != self._columns:
            with path.open(newline="") as stream:
                rows = [*csv.DictReader(stream), *rows]
        mode = "a" if path.exists() and columns == self._columns else "w"
        with path.open(mode, newline="") as stream:
            writer = csv.DictWriter(stream, fieldnames=columns)
            if mode == "w":
                writer.writeheader()
            writer.writerows(rows)
        self._columns = columns
        self._pending = []
