"""The Launcher interface: how the processes of a run are started."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any


class Launcher(ABC):
    """Starts the worker processes of a run and runs ``function`` in each of them."""

    @property
    @abstractmethod
    def is_interactive_compatible(self) -> bool:
        """Whether it works from a notebook or REPL (re-executing a script does not)."""

    @property
    @abstractmethod
    def caller_is_worker(self) -> bool:
        """Whether the calling process is itself rank 0 of the run.

        When false (spawn, fork), the workers' objects are copies: whatever the caller needs
        afterwards must come back through :meth:`launch`'s return value.
        """

    @abstractmethod
    def launch(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``function(*args, **kwargs)`` on every rank and return what rank 0 returned.

        If any rank fails, every rank is ended and the error raised here names the failing
        rank and carries its traceback.
        """
