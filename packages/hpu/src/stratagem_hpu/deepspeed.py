"""``hpu_deepspeed*``: stratagem-deepspeed's DeepSpeedStrategy on Gaudi cards over HCCL, by composition (needs
stratagem-deepspeed, and on Gaudi Habana's DeepSpeed with ``DS_ACCELERATOR=hpu``)."""

from __future__ import annotations

from typing import Any

from stratagem_deepspeed import DeepSpeedStrategy
from stratagem_hpu.execution import ExecutionMode
from stratagem_hpu.strategy import HPUDistributed


class HPUDeepSpeedStrategy(HPUDistributed, DeepSpeedStrategy):
    """DeepSpeed ZeRO with lazy-mode graph cuts, HCCL reductions and the other options of
    :class:`~stratagem_hpu.strategy.HPUStrategy`; every option of ``stratagem_deepspeed.DeepSpeedStrategy``."""

    def __init__(
        self, *, execution_mode: ExecutionMode | None = None, hpu_graphs: bool = False, **options: Any
    ) -> None:
        super().__init__(**options)
        self._take_hpu_options(execution_mode, hpu_graphs)
