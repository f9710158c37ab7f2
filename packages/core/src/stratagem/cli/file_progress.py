"""Progress of long file work in the CLI: what is read and how big it is, and a file as it grows."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TextIO


def format_bytes(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def footprint(path: Path) -> tuple[int, int]:
    """Number of files and their bytes under ``path`` (a file, or a directory walked whole)."""
    if not path.is_dir():
        return 1, path.stat().st_size
    files = size = 0
    for directory, _, names in os.walk(path):
        for name in names:
            files += 1
            size += os.stat(os.path.join(directory, name)).st_size
    return files, size


class GrowingFileReport:
    """While the ``with`` block runs, report every ``interval`` seconds the size of the file that
    :func:`find` returns (a file being written under a temporary name), with its write rate.

    On a terminal one line is rewritten in place; elsewhere (a log) a line is printed at each report.
    Nothing is printed for work that ends within the first interval.
    """

    def __init__(self, find: Callable[[], Path | None], stream: TextIO, interval: float = 1.0) -> None:
        self._find = find
        self._stream = stream
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._report, name="stratagem-file-progress", daemon=True)
        self._in_place = bool(getattr(stream, "isatty", None) and stream.isatty())
        self._printed = False

    def __enter__(self) -> GrowingFileReport:
        self._started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
        if self._in_place and self._printed:
            self._stream.write("\n")
            self._stream.flush()

    def _report(self) -> None:
        while not self._stop.wait(self._interval):
            path = self._find()
            try:
                size = path.stat().st_size if path is not None else None
            except OSError:
                size = None
            if size is None:
                continue
            elapsed = time.monotonic() - self._started
            line = f"  {format_bytes(size)} written ({format_bytes(size / elapsed)}/s, {elapsed:.0f} s)"
            self._stream.write(f"\r{line}\033[K" if self._in_place else f"{line}\n")
            self._stream.flush()
            self._printed = True
