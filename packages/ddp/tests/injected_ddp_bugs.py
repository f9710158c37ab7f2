"""A bug injected into the ddp strategy, registered as a strategy for the conformance kit to catch.

tests/test_conformance_catches_injected_ddp_bug.py makes the kit's processes find it through a written dist-info.
"""

from __future__ import annotations

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from stratagem.registry import Registry
from stratagem_ddp.strategy import DDPStrategy


class DDPWithoutInitialBroadcast(DDPStrategy):
    """DDP told not to broadcast rank 0's parameters when it wraps the module (``init_sync=False``)."""

    def configure_ddp(self, module: nn.Module) -> DistributedDataParallel:
        return DistributedDataParallel(module, init_sync=False)


def register(registry: Registry) -> None:
    registry.register(
        "ddp_bug_no_initial_broadcast", "injected_ddp_bugs:DDPWithoutInitialBroadcast", description="injected bug"
    )
