"""Starting XLA replicas with ``xmp.spawn``: one process per device of this host."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any

from stratagem.launchers import Launcher
from stratagem_xla import runtime


class XLALauncher(Launcher):
    """Runs the function in one replica per XLA device of this host, started by torch_xla's ``xmp.spawn``.

    Global ordinal 0's result comes back to the caller through a queue. When a replica fails or dies, or
    the caller is interrupted (Ctrl-C), the replicas still running are ended and the error names the
    replica's failure; nothing is left running.
    """

    def __init__(self, start_method: str = "spawn") -> None:
        self.start_method = start_method

    @property
    def is_interactive_compatible(self) -> bool:
        return self.start_method == "fork"

    @property
    def caller_is_worker(self) -> bool:
        return False

    def launch(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        runtime.require_xla()
        import torch_xla
        import torch_xla.distributed.xla_multiprocessing as xmp

        if torch_xla._XLAC._xla_runtime_is_initialized():
            raise RuntimeError(
                "strategy='xla' starts one process per XLA device with xmp.spawn, which torch_xla refuses once this "
                "process has used an XLA device. Create and run the Trainer before anything here touches an XLA "
                "device (torch_xla.device(), a tensor moved to 'xla')."
            )
        manager = multiprocessing.get_context(self.start_method).Manager()
        results = manager.Queue()
        started = set(multiprocessing.active_children())
        try:
            xmp.spawn(_run_replica, args=(function, args, kwargs, results), start_method=self.start_method)
        except BaseException as error:
            _end_replicas(started)
            if isinstance(error, KeyboardInterrupt):
                raise
            raise RuntimeError(
                f"An XLA replica failed, and the job was ended: {type(error).__name__}: {error}"
            ) from error
        try:
            return results.get(timeout=60)
        finally:
            manager.shutdown()


def _run_replica(
    index: int, function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], results: Any
) -> None:
    import torch_xla.runtime as xr

    result = function(*args, **kwargs)
    if xr.global_ordinal() == 0:
        results.put(result)


def _end_replicas(before: set[multiprocessing.process.BaseProcess]) -> None:
    for child in multiprocessing.active_children():
        if child not in before:
            child.terminate()
    for child in multiprocessing.active_children():
        if child not in before:
            child.join(timeout=10)
