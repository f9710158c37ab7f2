"""A sign of life every rank leaves in the rendezvous store, so that a rank whose collective timed out can tell
the ranks that were lost (their process ended, or their host left the network) from ranks alive elsewhere.

A collective alone cannot tell them apart: a rank that never arrives looks the same whether it is stuck in other
code or gone. A thread of each rank writes a beat every :data:`BEAT_SECONDS` through a connection of its own
(the training loop writes nothing): a rank whose beat does not change while another one waits
:data:`SILENCE_SECONDS` is gone.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

BEAT_SECONDS = 1.0
SILENCE_SECONDS = 3.5
"""How long a beat must stay unchanged for its rank to count as lost: three beats and a half, so that a thread
that a loaded machine delays for a beat or two is not taken for dead."""
_STORE_TIMEOUT = timedelta(seconds=5)
"""Bounds each beat's write: a store that went away ends the beats instead of holding them."""
_FAILURES_TO_STOP = 3
"""Writes failing in a row (about 18 s without the store) after which the beats stop."""


@dataclass(frozen=True)
class Beat:
    """One rank's latest sign of life."""

    sequence: int
    batches: int
    """How many training batches the rank had checked with every other rank (one exchange each) by then."""
    host: str


class Heartbeat:
    """Writes this rank's :class:`Beat` under ``alive/<rank>`` in ``store`` every :data:`BEAT_SECONDS` until
    :meth:`stop`; ``batches`` is read for each beat."""

    def __init__(self, store: dist.Store, rank: int, batches: Callable[[], int]) -> None:
        self._key = f"alive/{rank}"
        self._batches = batches
        self._host = socket.gethostname()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        # A connection of its own: a write blocked on a store that went away must not hold the main connection,
        # which the failing rank reads the others' beats through.
        clone: Callable[[], dist.Store] | None = getattr(store, "clone", None)
        try:
            own = clone() if clone is not None else None
        except (RuntimeError, NotImplementedError):
            own = None
        if own is None:
            return  # a store that cannot be shared across threads: no beats, and no rank is reported lost
        own.set_timeout(_STORE_TIMEOUT)
        self._write(own, 0)  # before the thread starts: a rank that joined has a beat to be read
        self._thread = threading.Thread(target=self._beat, args=(own,), name="stratagem-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self, store: dist.Store) -> None:
        sequence, failures = 1, 0
        while not self._stopped.wait(BEAT_SECONDS):
            failures = 0 if self._write(store, sequence) else failures + 1
            if failures == _FAILURES_TO_STOP:
                return  # the store is gone: each further write would only add torch's warning to the output
            sequence += 1

    def _write(self, store: dist.Store, sequence: int) -> bool:
        try:
            store.set(self._key, f"{sequence}\n{self._batches()}\n{self._host}")
        except RuntimeError:
            return False  # the store is gone (the run ends), or slow (the next beat gets through)
        return True

    def stop(self) -> None:
        """End the beats. Waits for the thread: on rank 0 its connection shares the store's server, which
        must close with the run (a later run binds the same port)."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=_STORE_TIMEOUT.total_seconds() + BEAT_SECONDS)
            self._thread = None


def read_beats(store: dist.Store, ranks: list[int], all_written: bool = False) -> dict[int, Beat | None]:
    """The latest beat in ``store`` of each of ``ranks`` (``None`` for a rank that has written none), read in one
    request once it is known which have written one (``all_written``: every one of ``ranks`` has)."""
    written = ranks if all_written else [rank for rank in ranks if store.check([f"alive/{rank}"])]
    beats: dict[int, Beat | None] = dict.fromkeys(ranks)
    values = store.multi_get([f"alive/{rank}" for rank in written]) if written else []
    for rank, value in zip(written, values):
        sequence, batches, host = value.decode().split("\n", 2)
        beats[rank] = Beat(int(sequence), int(batches), host)
    return beats
