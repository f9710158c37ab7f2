"""Giving a finished checkpoint its name, so that a reader never finds it half-written or missing.

Every writer, whatever its layout (one file, a directory of shards), writes under
:func:`temporary_sibling` and then calls :func:`move_into_place`; nobody deletes the old
checkpoint first.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path


def temporary_sibling(target: Path) -> Path:
    """A fresh name beside ``target``: same filesystem (so renames are atomic), hidden from checkpoint finders."""
    return target.parent / f".{target.name}.tmp-{uuid.uuid4().hex[:12]}"


def move_into_place(finished: Path, target: Path) -> None:
    """Give the complete file or directory ``finished`` the name ``target``, replacing what is there.

    A file takes the place of a file or a link in one atomic rename. A directory cannot be renamed
    over anything but an empty directory, so what is there is first renamed aside and deleted only
    once the new one has the name: a crash in between leaves both whole. A link is replaced, never
    followed, so the checkpoint it points to is left alone.
    """
    _fsync_tree(finished)
    previous = None
    one_rename = finished.is_file() and (target.is_symlink() or not target.is_dir())
    if not one_rename and os.path.lexists(target):
        previous = temporary_sibling(target)
        os.replace(target, previous)
    os.replace(finished, target)
    _fsync_directory(target.parent)
    if previous is not None:
        if previous.is_dir() and not previous.is_symlink():
            shutil.rmtree(previous)
        else:
            previous.unlink()


def _fsync_tree(root: Path) -> None:
    if not root.is_dir():
        _fsync_file(root)
        return
    for directory, _, files in os.walk(root):
        for name in files:
            _fsync_file(Path(directory, name))
        _fsync_directory(Path(directory))


def _fsync_file(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _fsync_directory(directory: Path) -> None:
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)
