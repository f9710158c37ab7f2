"""``single_xla``: one process on one XLA device."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from stratagem.strategies import SingleDeviceStrategy, StrategyOptions
from stratagem_xla import stepping
from stratagem_xla.base import XLAStrategyBase
from stratagem_xla.options import check_debug, with_xla_defaults
from stratagem_xla.precision_support import check_precision

if TYPE_CHECKING:
    from typing_extensions import Unpack


class SingleXLAStrategy(XLAStrategyBase, SingleDeviceStrategy):
    """One process training on one XLA device (a TPU core, or XLA's CPU device where there is no TPU).

    Batches arrive through torch_xla's parallel loader, which ends each step's traced graph, and
    checkpoints are written with every tensor moved to the CPU (:class:`~stratagem_xla.XLACheckpointIO`), so
    that any strategy loads them. ``debug=True`` prints XLA's metrics report when the run ends.
    """

    one_device_name = "single_xla"
    several_devices_instead = (
        "strategy='xla' for one process per device, or 'xla_fsdp_v2' to shard one process's model over every device"
    )

    def __init__(
        self,
        device: torch.device | str | int | None = None,
        *,
        debug: bool = False,
        **strategy_options: Unpack[StrategyOptions],
    ) -> None:
        if isinstance(device, int):
            device = torch.device("xla", device)
        super().__init__(device=device, **with_xla_defaults(strategy_options))
        self.debug = check_debug(debug, type(self).__name__)

    def complete_configuration(self) -> None:
        super().complete_configuration()
        check_precision(self.precision, "single_xla")

    def setup_environment(self) -> None:
        # The runtime names the device (xla:0 in a process of its own; the index may differ under a launcher).
        self._device = stepping.xla_device()
        super().setup_environment()

    def __repr__(self) -> str:
        return f"SingleXLAStrategy(device={str(self.root_device)!r}, debug={self.debug})"
