"""Models, data and set-up shared by the fsdp tests; importable in the worker processes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import stratagem
from stratagem_fsdp import FSDPStrategy

LEARNING_RATE = 0.05


@dataclass(frozen=True)
class Opaque:
    """A plain entry that only an unrestricted (not weights-only) load may unpickle."""

    value: int


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x)) + x


class Net(nn.Module):
    """Odd sizes on purpose: shards of uneven length on 2 ranks."""

    def __init__(self, width: int = 13, depth: int = 3) -> None:
        super().__init__()
        self.inp = nn.Linear(5, width)
        self.blocks = nn.ModuleList([Block(width) for _ in range(depth)])
        self.norm = nn.LayerNorm(width)
        self.out = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.out(self.norm(h))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int = 0) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x), y)


def global_batches(count: int, size: int = 8, seed: int = 1234) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(size, 5, generator=generator), torch.randn(size, 1, generator=generator)) for _ in range(count)
    ]


def local_part(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's equal share of a global batch."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    return tuple(tensor.chunk(world)[rank] for tensor in batch)  # type: ignore[return-value]


def make_strategy(devices: int = 2, precision: str = "32-true", **options: Any) -> FSDPStrategy:
    """An FSDPStrategy resolved as the Trainer would and set up in this (already grouped) worker."""
    strategy = stratagem.resolve(
        strategy=FSDPStrategy(**options), accelerator="cpu", devices=devices, precision=precision
    )
    assert isinstance(strategy, FSDPStrategy)
    strategy.setup_environment()
    return strategy


def build(strategy: FSDPStrategy, seed: int = 0, module_class: type[nn.Module] = Net, empty_init: bool | None = None):
    """Create the module under the strategy's init context, set it up, and give it an AdamW optimizer."""
    torch.manual_seed(seed)
    with strategy.module_init_context(empty_init):
        module = module_class()
    strategy.setup_module(module)
    [optimizer] = strategy.setup_optimizers([torch.optim.AdamW(module.parameters(), lr=LEARNING_RATE)])
    return module, optimizer


def train(strategy: FSDPStrategy, optimizer: torch.optim.Optimizer, batches, clip: float | None = None) -> list[float]:
    """One optimizer step per global batch; returns the global mean loss of each step."""
    losses = []
    for batch in batches:
        loss = strategy.run_step("training_step", local_part(batch))
        strategy.backward(loss, optimizer)
        if clip is not None:
            strategy.clip_gradients(optimizer, clip)
        strategy.optimizer_step(optimizer)
        strategy.zero_grad(optimizer)
        losses.append(strategy.reduce(loss.detach().float()).item())
    return losses


def reference_run(batches, seed: int = 0, clip: float | None = None) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The same training in one plain process on whole batches: losses and final weights."""
    torch.manual_seed(seed)
    module = Net()
    optimizer = torch.optim.AdamW(module.parameters(), lr=LEARNING_RATE)
    losses = []
    for batch in batches:
        loss = module.training_step(batch)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(module.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, {key: value.detach().clone() for key, value in module.state_dict().items()}


def local_and_total_numel(module: nn.Module) -> tuple[int, int]:
    local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in module.parameters())
    return local, sum(p.numel() for p in module.parameters())
