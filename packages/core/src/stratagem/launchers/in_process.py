from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stratagem.launchers.launcher import Launcher


class InProcessLauncher(Launcher):
    """Runs the function in the calling process: one process, nothing to start."""

    @property
    def is_interactive_compatible(self) -> bool:
        return True

    @property
    def caller_is_worker(self) -> bool:
        return True

    def launch(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs)
