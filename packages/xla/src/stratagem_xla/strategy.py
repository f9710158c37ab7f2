"""``single_xla``: one process on one XLA device."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from stratagem.accelerators import Accelerator
from stratagem.checkpoint_io import CheckpointIO
from stratagem.environments import ClusterEnvironment
from stratagem.precision import Precision
from stratagem.strategies import DefersHostReads, FeedsBatchesToDevice, SingleDeviceStrategy
from stratagem_xla import runtime, stepping
from stratagem_xla.accelerator import XLAAccelerator
from stratagem_xla.checkpoint_io import XLACheckpointIO
from stratagem_xla.precision_support import check_precision


class SingleXLAStrategy(SingleDeviceStrategy, FeedsBatchesToDevice, DefersHostReads):
    """One process training on one XLA device (a TPU core, or XLA's CPU device where there is no TPU).

    Batches arrive through torch_xla's parallel loader, which ends each step's traced graph, and
    checkpoints are written with every tensor moved to the CPU (:class:`~stratagem_xla.XLACheckpointIO`), so
    that any strategy loads them. ``debug=True`` prints XLA's metrics report when the run ends.
    """

    # Reading each step's loss on the host would cut XLA's traced graph and wait for the device every step.

    @staticmethod
    def is_available() -> bool:
        return runtime.load_problem() is None

    @staticmethod
    def unavailable_reason() -> str:
        return runtime.load_problem() or ""

    def __init__(
        self,
        device: torch.device | str | int | None = None,
        accelerator: Accelerator | None = None,
        precision: Precision | None = None,
        checkpoint_io: CheckpointIO | None = None,
        debug: bool = False,
    ) -> None:
        if isinstance(device, int):
            device = torch.device("xla", device)
        super().__init__(
            device=device,
            accelerator=accelerator or XLAAccelerator(),
            precision=precision,
            checkpoint_io=checkpoint_io or XLACheckpointIO(),
        )
        if not isinstance(debug, bool):
            raise TypeError(f"SingleXLAStrategy(debug={debug!r}) is not valid; expected True or False.")
        self.debug = debug

    def configure_placement(
        self, *, devices: list[torch.device], num_nodes: int, cluster_environment: ClusterEnvironment
    ) -> None:
        if len(devices) * num_nodes != 1:
            raise ValueError(
                f"strategy='single_xla' runs on exactly one XLA device, but devices={len(devices)} and "
                f"num_nodes={num_nodes} ask for {len(devices) * num_nodes}. Use devices=1, or strategy='xla' for "
                "one process per device, or 'xla_fsdp_v2' to shard one process's model over every device."
            )
        super().configure_placement(devices=devices, num_nodes=num_nodes, cluster_environment=cluster_environment)

    def complete_configuration(self) -> None:
        super().complete_configuration()
        check_precision(self.precision, "single_xla")

    def setup_environment(self) -> None:
        # The runtime names the device (xla:0 in a process of its own; the index may differ under a launcher).
        self._device = stepping.xla_device()
        super().setup_environment()

    @contextlib.contextmanager
    def module_init_context(self, empty_init: bool | None = None) -> Iterator[None]:
        with stepping.cpu_module_init(self.precision, empty_init):
            yield

    def device_batches(self, batches: Iterator[Any]) -> Iterator[Any]:
        return stepping.feed(batches, self.root_device)

    def teardown(self) -> None:
        super().teardown()
        if self.debug:
            stepping.print_debug_metrics()

    def __repr__(self) -> str:
        return f"SingleXLAStrategy(device={str(self.root_device)!r}, debug={self.debug})"
