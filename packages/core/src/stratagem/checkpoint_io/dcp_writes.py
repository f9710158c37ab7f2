"""Writing a checkpoint's files so that a failed write is reported as the ``OSError`` it was.

``torch.save`` swallows the ``OSError`` its stream raises and reports only that its position is off
(``unexpected pos 704 vs 598`` for a full disk). Here every stream the save writes to records the
first ``OSError`` with the file's name, and the save re-raises that one instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem


class _Recorder:
    """Holds the first ``OSError`` that a write through one of its streams raised."""

    def __init__(self) -> None:
        self.error: OSError | None = None

    def record(self, error: OSError, path: Path) -> None:
        if self.error is None:
            self.error = OSError(error.errno, error.strerror, str(path)) if error.filename is None else error


class _RecordingStream:
    """A file opened for writing whose failed writes are recorded before they reach torch."""

    def __init__(self, stream: Any, path: Path, recorder: _Recorder) -> None:
        self._stream, self._path, self._recorder = stream, path, recorder

    def write(self, data: Any) -> int:
        return self._call("write", data)

    def flush(self) -> None:
        self._call("flush")

    def close(self) -> None:
        self._call("close")

    def _call(self, name: str, *args: Any) -> Any:
        try:
            return getattr(self._stream, name)(*args)
        except OSError as error:
            self._recorder.record(error, self._path)
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _RecordingFileSystem(FileSystem):
    def __init__(self, recorder: _Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[Any]:
        with super().create_stream(path, mode) as stream:
            yield stream if "r" in mode else _RecordingStream(stream, Path(path), self.recorder)


class FailedWritesNamedWriter(FileSystemWriter):
    """DCP's writer, raising the ``OSError`` (with the file's name) that made a write fail; DCP passes it
    on to every rank."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self._recorder = _Recorder()
        self.fs = _RecordingFileSystem(self._recorder)

    def write_data(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().write_data(*args, **kwargs)
        except Exception as error:
            self._raise_recorded(error)
            raise

    def finish(self, *args: Any, **kwargs: Any) -> None:
        try:
            super().finish(*args, **kwargs)
        except Exception as error:
            self._raise_recorded(error)
            raise

    def _raise_recorded(self, error: Exception) -> None:
        recorded = self._recorder.error
        if recorded is not None and recorded is not error:
            raise recorded from error


def save_file(value: Any, path: Path) -> None:
    """``torch.save(value, path)``, a failed write raising the ``OSError`` it was."""
    recorder = _Recorder()
    try:
        with path.open("wb") as stream:
            torch.save(value, _RecordingStream(stream, path, recorder))
    except Exception as error:
        if isinstance(error, OSError):
            recorder.record(error, path)
        if recorder.error is None or recorder.error is error:
            raise
        raise recorder.error from error
