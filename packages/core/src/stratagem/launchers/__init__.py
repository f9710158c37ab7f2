"""Launchers: how the processes of a run are started."""

from stratagem.launchers.failures import RankFailedError, RankFailure
from stratagem.launchers.in_process import InProcessLauncher
from stratagem.launchers.launcher import Launcher
from stratagem.launchers.multiprocessing_launcher import MultiprocessingLauncher
from stratagem.launchers.start_methods import START_METHODS, check_start_method, create_launcher
from stratagem.launchers.subprocess_launcher import SubprocessLauncher

__all__ = [
    "START_METHODS",
    "InProcessLauncher",
    "Launcher",
    "MultiprocessingLauncher",
    "RankFailedError",
    "RankFailure",
    "SubprocessLauncher",
    "check_start_method",
    "create_launcher",
]
