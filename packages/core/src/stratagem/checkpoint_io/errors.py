"""The one error a checkpoint that cannot be read raises, whichever strategy wrote it."""

from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint that cannot be read: an empty, truncated or corrupt file, a structure that is not a
    stratagem checkpoint, or a pickled object that a weights-only load refuses.

    The message names the file and what is wrong with it. A ``ValueError``: the file, like any other
    bad input, is the caller's to fix.
    """
