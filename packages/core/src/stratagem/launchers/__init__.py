"""Launchers: how the processes of a run are started."""

from stratagem.launchers.in_process import InProcessLauncher
from stratagem.launchers.launcher import Launcher

__all__ = ["InProcessLauncher", "Launcher"]
