"""``hpu_fsdp``: stratagem-fsdp's FSDPStrategy on Gaudi cards over HCCL, by composition (needs stratagem-fsdp)."""

from __future__ import annotations

from typing import Any

from stratagem_fsdp import FSDPStrategy
from stratagem_hpu.execution import ExecutionMode
from stratagem_hpu.strategy import HPUDistributed


class HPUFSDPStrategy(HPUDistributed, FSDPStrategy):
    """Parameters, gradients and optimizer state sharded over the cards by ``fully_shard``; lazy-mode graph cuts,
    HCCL reductions and the other options of :class:`~stratagem_hpu.strategy.HPUStrategy`; every option of
    ``stratagem_fsdp.FSDPStrategy``."""

    def __init__(
        self, *, execution_mode: ExecutionMode | None = None, hpu_graphs: bool = False, **options: Any
    ) -> None:
        super().__init__(**options)
        self._take_hpu_options(execution_mode, hpu_graphs)
