"""The collectives of a run that is one process: there is no other rank to reduce with, gather from or wait for."""

from __future__ import annotations

from typing import Any

import torch

from stratagem.strategies.collective_arguments import reduce_operation
from stratagem.strategies.strategy import ReduceOp


class SingleProcessCollectives:
    """:class:`~stratagem.strategies.Strategy`'s collectives for a strategy whose whole run is this process (one
    device, or several driven from it): each is an identity. Listed before ``Strategy`` among a class's bases."""

    def reduce(self, tensor: Any, op: ReduceOp = "mean", *, group: Any = None, reduce_op: Any = None) -> Any:
        reduce_operation(op, reduce_op)
        return tensor

    def all_gather(self, tensor: torch.Tensor, sync_grads: bool = False, *, group: Any = None) -> torch.Tensor:
        return tensor.unsqueeze(0)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return obj

    def barrier(self, name: str | None = None) -> None:
        return None
