"""stratagem-fsdp: ``Trainer(strategy="fsdp")`` on PyTorch's ``fully_shard``.

Importing this package is cheap: the names below load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stratagem.exports import lazy_exports

if TYPE_CHECKING:
    from stratagem.checkpoint_io.async_sharded import AsyncDistributedCheckpointIO
    from stratagem.checkpoint_io.sharded import DistributedCheckpointIO
    from stratagem_fsdp.model_parallel import ModelParallelStrategy
    from stratagem_fsdp.pipeline import PipelineStrategy
    from stratagem_fsdp.strategy import FSDPStrategy

__all__ = [
    "AsyncDistributedCheckpointIO",
    "DistributedCheckpointIO",
    "FSDPStrategy",
    "ModelParallelStrategy",
    "PipelineStrategy",
    "__version__",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "FSDPStrategy": "stratagem_fsdp.strategy",
        "ModelParallelStrategy": "stratagem_fsdp.model_parallel",
        "PipelineStrategy": "stratagem_fsdp.pipeline",
        "DistributedCheckpointIO": "stratagem.checkpoint_io.sharded",
        "AsyncDistributedCheckpointIO": "stratagem.checkpoint_io.async_sharded",
    },
    "stratagem-fsdp",
)
