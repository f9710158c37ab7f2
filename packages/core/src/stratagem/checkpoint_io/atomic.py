"""Giving a finished checkpoint its name, so that a reader never finds it half-written or missing.

Every writer, whatever its layout (one file, a directory of shards), writes under
:func:`temporary_sibling` and then calls :func:`move_into_place`; nobody deletes the old
checkpoint first.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any


def temporary_sibling(target: Path) -> Path:
    """A fresh name beside ``target``: same filesystem (so renames are atomic), hidden from checkpoint finders."""
    return target.parent / f"{_TEMPORARY_PREFIX.format(name=target.name)}{uuid.uuid4().hex[:12]}"


def temporary_siblings(target: Path) -> list[Path]:
    """The names :func:`temporary_sibling` gave beside ``target`` that exist now (a write in progress)."""
    prefix = _TEMPORARY_PREFIX.format(name=target.name)
    try:
        return sorted(path for path in target.parent.iterdir() if path.name.startswith(prefix))
    except OSError:
        return []


_TEMPORARY_PREFIX = ".{name}.tmp-"


def move_into_place(finished: Path, target: Path) -> None:
    """Give the complete file or directory ``finished`` the name ``target``, replacing what is there.

    A file takes the place of a file or a link in one atomic rename. A directory cannot be renamed
    over anything but an empty directory, so on Linux the two names are swapped in one step
    (``renameat2(RENAME_EXCHANGE)``) and the previous checkpoint, now under the temporary name, is
    deleted. Where the system or filesystem cannot swap, what is there is first renamed aside: a crash
    between the two renames leaves both whole but ``target`` missing. A link is replaced, never
    followed, so the checkpoint it points to is left alone.
    """
    _fsync_tree(finished)
    one_rename = finished.is_file() and (target.is_symlink() or not target.is_dir())
    if one_rename or not os.path.lexists(target):
        os.replace(finished, target)
        _fsync_directory(target.parent)
        return
    if _exchange(finished, target):
        previous = finished
    else:
        previous = temporary_sibling(target)
        os.replace(target, previous)
        os.replace(finished, target)
    _fsync_directory(target.parent)
    if previous.is_dir() and not previous.is_symlink():
        shutil.rmtree(previous)
    else:
        previous.unlink()


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


@functools.cache
def _renameat2() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    function = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if function is not None:
        function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        function.restype = ctypes.c_int
    return function


def _exchange(first: Path, second: Path) -> bool:
    """Swap what two existing names point to in one step; False where this system or filesystem cannot."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return True
    error = ctypes.get_errno()
    if error in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM):
        return False
    raise OSError(error, os.strerror(error), str(first), None, str(second))


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
