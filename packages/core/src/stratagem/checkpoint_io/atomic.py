"""Giving a finished checkpoint its name, so that a reader never finds it half-written or missing.

Every writer, whatever its layout (one file, a directory of shards), writes under
:func:`temporary_sibling` and then calls :func:`move_into_place`; nobody deletes the old
checkpoint first. What a writer that crashed left under a temporary name is removed by
:func:`remove_stale_temporaries` at a later save.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import hashlib
import os
import re
import shutil
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Any


def temporary_sibling(target: Path) -> Path:
    """A fresh name beside ``target``: same filesystem (so renames are atomic), hidden from checkpoint finders.

    The name records which process writes it (a hash of the host name and the pid), so that
    :func:`remove_stale_temporaries` can tell what a crashed writer left from a write in progress.
    """
    writer = f"{_host_tag()}-{os.getpid()}"
    return target.parent / f"{_TEMPORARY_PREFIX.format(name=target.name)}{writer}-{uuid.uuid4().hex[:8]}"


def temporary_siblings(target: Path) -> list[Path]:
    """The names :func:`temporary_sibling` gave beside ``target`` that exist now (a write in progress)."""
    prefix = _TEMPORARY_PREFIX.format(name=target.name)
    try:
        return sorted(path for path in target.parent.iterdir() if path.name.startswith(prefix))
    except OSError:
        return []


DEAD_WRITER_GRACE_SECONDS = 60.0
"""How long a temporary whose writer is a dead process of this host stays untouched before it is removed."""

UNKNOWN_WRITER_SECONDS = 24 * 3600.0
"""How long any other temporary (its writer on another host, say) stays untouched before it is removed."""


def remove_stale_temporaries(directory: Path) -> list[Path]:
    """Remove what crashed writers left in ``directory`` under :func:`temporary_sibling` names, and reservations
    (:func:`claim_name`) that are moot; return them.

    Only names of that form are considered, and only certainly stale ones removed: written by a
    process of this host that no longer exists and untouched for :data:`DEAD_WRITER_GRACE_SECONDS`,
    or untouched for :data:`UNKNOWN_WRITER_SECONDS` whoever wrote it (the writer may be on another
    host of a shared filesystem, or its pid reused). A write in progress in another live run is left alone.
    """
    try:
        entries = list(directory.iterdir())
    except OSError:
        return []
    now = time.time()
    removed = []
    for entry in entries:
        claimed = _CLAIM_NAME.fullmatch(entry.name)
        if claimed is not None:
            # Moot once its checkpoint holds the name, or when the process that reserved it is gone.
            if os.path.lexists(entry.parent / claimed.group(1)) or _claimed_by_dead_writer(entry):
                _remove_quietly(entry)
                removed.append(entry)
            continue
        match = _TEMPORARY_NAME.fullmatch(entry.name)
        if match is None:
            continue
        try:
            untouched = now - _newest_change(entry)
        except FileNotFoundError:
            continue
        pid = match.group("pid")
        writer_dead = match.group("host") == _host_tag() and pid is not None and not _process_exists(int(pid))
        if untouched >= (DEAD_WRITER_GRACE_SECONDS if writer_dead else UNKNOWN_WRITER_SECONDS):
            _remove_quietly(entry)
            removed.append(entry)
    return removed


_TEMPORARY_PREFIX = ".{name}.tmp-"
_CLAIM_NAME = re.compile(r"\.(.+)\.claim")
# New names carry host and pid; the older form (12 hex digits) has neither and only ages out.
_TEMPORARY_NAME = re.compile(r"\..+\.tmp-(?:(?P<host>[0-9a-f]{8})-(?P<pid>\d+)-[0-9a-f]{8}|[0-9a-f]{12})")


@functools.cache
def _host_tag() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def _process_exists(pid: int) -> bool:
    if os.name != "posix":
        return True  # no harmless way to ask; the age rule still applies
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


def _newest_change(path: Path) -> float:
    """The latest modification time in ``path`` (a file, a link, or a directory tree)."""
    newest = path.lstat().st_mtime
    if path.is_dir() and not path.is_symlink():
        for directory, subdirectories, files in os.walk(path):
            for name in [*subdirectories, *files]:
                with contextlib.suppress(FileNotFoundError):
                    newest = max(newest, os.lstat(os.path.join(directory, name)).st_mtime)
    return newest


def _remove_quietly(path: Path) -> None:
    # Another run may be cleaning the same directory at the same moment.
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def claim_name(target: Path) -> bool:
    """Reserve the unused name ``target`` for a checkpoint this process is about to write; False when the name
    holds something already or another writer has reserved it.

    The reservation is a hidden marker beside ``target``, created in one step (``O_EXCL``) so that of two
    runs saving into one directory at once only one gets a name; release it with :func:`release_name`
    once the checkpoint is in place. A marker whose writer is a dead process of this host is taken over.
    """
    marker = _claim_marker(target)
    marker.parent.mkdir(parents=True, exist_ok=True)
    writer = f"{_host_tag()}-{os.getpid()}"
    for _ in range(2):
        try:
            descriptor = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
        except FileExistsError:
            if not _claimed_by_dead_writer(marker):
                return False
            _remove_quietly(marker)
            continue
        with os.fdopen(descriptor, "w") as file:
            file.write(writer)
        if os.path.lexists(target):
            release_name(target)
            return False
        return True
    return False


def release_name(target: Path) -> None:
    """Drop the reservation :func:`claim_name` made for ``target``."""
    with contextlib.suppress(FileNotFoundError):
        _claim_marker(target).unlink()


def _claim_marker(target: Path) -> Path:
    return target.parent / f".{target.name}.claim"


def _claimed_by_dead_writer(marker: Path) -> bool:
    try:
        host, _, pid = marker.read_text()[:64].partition("-")
    except OSError:
        return False
    return host == _host_tag() and pid.isdigit() and not _process_exists(int(pid))


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
