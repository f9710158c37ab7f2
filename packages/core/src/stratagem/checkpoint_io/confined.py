"""The files of a checkpoint directory as a reader may open them: inside the directory, and regular.

A checkpoint is untrusted input. A symbolic link inside it (a tag directory, a ``zero/`` folder, a
``*.distcp`` piece) could make a reader open a file elsewhere on disk, one that no weights-only check
has looked at; a FIFO, a socket or a device in place of a file would block a read or never end it.
Every reader takes the paths it opens from here, so each is refused, naming it, before anything
opens it. Links that stay inside the directory are followed, as a backend's own reader would.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from stratagem.checkpoint_io.errors import CheckpointError

MAX_FILES = 1_000_000
"""More entries than any checkpoint holds: a directory with more (links multiplying paths, say) is refused."""

_KINDS = {
    stat.S_IFIFO: "a named pipe (FIFO)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def regular_file(path: Path) -> Path:
    """``path`` if it is a regular file (a link to one counts); :class:`CheckpointError` naming it otherwise.

    Checked without opening it, so a pipe or a device never blocks the caller."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if os.path.islink(path):
            raise CheckpointError(f"{str(path)!r} is a broken link (it points to {os.readlink(path)!r}).") from None
        raise
    if not stat.S_ISREG(mode):
        raise CheckpointError(f"{str(path)!r} is {_kind(mode)}, not a checkpoint file; nothing was read from it.")
    return path


def checkpoint_file(directory: Path, name: str | os.PathLike[str]) -> Path:
    """``directory / name``, checked as :func:`checkpoint_files` checks each file it lists."""
    path = Path(directory) / name
    _check_inside(_real_directory(directory), Path(directory), path)
    return regular_file(path)


def optional_checkpoint_file(directory: Path, name: str | os.PathLike[str]) -> Path | None:
    """:func:`checkpoint_file`, or ``None`` when nothing (not even a broken link) is at ``directory / name``."""
    path = Path(directory) / name
    if not os.path.lexists(path):
        return None
    return checkpoint_file(directory, name)


def checkpoint_files(directory: Path, within: str | os.PathLike[str] | None = None) -> list[Path]:
    """Every regular file under ``directory`` (or under its subdirectory ``within``), by the path a reader
    reaches it through, links that stay inside ``directory`` followed.

    Raises :class:`CheckpointError` naming the first entry that is a link leading outside ``directory``
    (directly or through its parent folders), a broken link, a link that loops, or not a regular file
    or directory (a pipe, a socket, a device)."""
    root = Path(directory)
    real_root = _real_directory(root)
    start = root / within if within is not None else root
    _check_inside(real_root, root, start)
    found: list[Path] = []
    _walk(real_root, root, start, (os.path.realpath(start),), found)
    return found


def _walk(real_root: str, root: Path, folder: Path, ancestors: tuple[str, ...], found: list[Path]) -> None:
    with os.scandir(folder) as entries:
        paths = sorted(Path(entry.path) for entry in entries)
    for path in paths:
        if len(found) >= MAX_FILES:
            raise CheckpointError(f"{str(root)!r} holds more than {MAX_FILES} files; it is not a checkpoint.")
        _check_inside(real_root, root, path)
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            raise CheckpointError(
                f"{str(path)!r} is a broken link (it points to {os.readlink(path)!r}); the checkpoint "
                f"{str(root)!r} is incomplete."
            ) from None
        if stat.S_ISDIR(mode):
            real = os.path.realpath(path)
            if real in ancestors:
                raise CheckpointError(f"{str(path)!r} is a link to a folder that contains it: a loop.")
            _walk(real_root, root, path, (*ancestors, real), found)
        elif stat.S_ISREG(mode):
            found.append(path)
        else:
            raise CheckpointError(
                f"{str(path)!r} is {_kind(mode)}, not a file of a checkpoint; nothing in {str(root)!r} was read."
            )


def _real_directory(directory: Path) -> str:
    # The checkpoint path the user gave may itself be a link (ModelCheckpoint's save_last="link" makes
    # one): what it names is the checkpoint, so the comparison is with its real location.
    real = os.path.realpath(directory)
    if not os.path.isdir(real):
        raise CheckpointError(f"{str(directory)!r} is not a checkpoint directory.")
    return real


def _check_inside(real_root: str, root: Path, path: Path) -> None:
    real = os.path.realpath(path)
    if real != real_root and not real.startswith(real_root.rstrip(os.sep) + os.sep):
        raise CheckpointError(
            f"{str(path)!r} leads outside the checkpoint {str(root)!r} (to {real!r}) through a symbolic link. "
            "A checkpoint's readers open only files inside its directory; nothing was read. Copy the files "
            "into the checkpoint if you meant to use them."
        )


def _kind(mode: int) -> str:
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file" if not stat.S_ISDIR(mode) else "a directory")
