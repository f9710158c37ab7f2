"""Shared pieces of the DeepSpeed tests: a small model, its data, a reference run, and the
functions that worker processes run (module-level, so the pool can send them by reference)."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

import stratagem
from stratagem.strategies import LoopSettings, Strategy
from stratagem.testing import DistributedWorkers

WORKER_ENV = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
"""Environment of the worker pools: DeepSpeed's CPU accelerator, chosen without probing."""

OP_BUILD_TIMEOUT = 540
"""Seconds allowed to a call that may compile a DeepSpeed op from an empty cache on 2 busy cores."""

PER_RANK_BATCH = 2
STEPS_NVME = 3
LEARNING_RATE = 1e-2


class RegressionNet(nn.Module):
    """Two linear layers: small enough to compare against a plain single-process run exactly."""

    def __init__(self) -> None:
        super().__init__()
        self.layer1 = nn.Linear(8, 16)
        self.layer2 = nn.Linear(16, 4)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer2(torch.relu(self.layer1(x)))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x).float(), y.float())


def global_batches(steps: int, world_size: int = 2, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    size = PER_RANK_BATCH * world_size
    return [
        (torch.randn(size, 8, generator=generator), torch.randn(size, 4, generator=generator)) for _ in range(steps)
    ]


def rank_slice(batch: tuple[torch.Tensor, torch.Tensor], rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    start = rank * PER_RANK_BATCH
    return batch[0][start : start + PER_RANK_BATCH], batch[1][start : start + PER_RANK_BATCH]


def initial_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return copy.deepcopy(RegressionNet().state_dict())


def reference_setup() -> tuple[RegressionNet, torch.optim.Optimizer]:
    model = RegressionNet()
    model.load_state_dict(initial_weights())
    return model, torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)


def reference_train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int, start_step: int = 0) -> list[float]:
    """One process, the whole global batch per step: what every ZeRO stage must reproduce."""
    losses = []
    for batch in global_batches(start_step + steps)[start_step:]:
        loss = model.training_step(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def reference_run(steps: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Losses and final weights of ``steps`` single-process steps with torch AdamW from the initial weights."""
    model, optimizer = reference_setup()
    losses = reference_train(model, optimizer, steps)
    return losses, model.state_dict()


# -- run in the workers ----------------------------------------------------------------------


def join_deepspeed() -> None:
    """Let DeepSpeed take over the pool's process group; the first time, this compiles its shm_comm op
    (a minute or more from an empty TORCH_EXTENSIONS_DIR), so pools call it once with a long timeout."""
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")


def worker_pool() -> DistributedWorkers:
    pool = DistributedWorkers(2, env=WORKER_ENV)
    pool.run(join_deepspeed, timeout=OP_BUILD_TIMEOUT)
    return pool


def create_strategy(
    strategy: str | dict[str, Any],
    precision: str = "32-true",
    settings: LoopSettings | None = None,
    devices: int = 2,
) -> Strategy:
    """Resolve ``strategy`` (an alias, or DeepSpeedStrategy options) as the Trainer would, in a worker."""
    if isinstance(strategy, dict):
        from stratagem_deepspeed import DeepSpeedStrategy

        strategy = DeepSpeedStrategy(**strategy)
    resolved = stratagem.resolve(strategy=strategy, accelerator="cpu", devices=devices, precision=precision)
    resolved.connect_loop_settings(settings or LoopSettings())
    resolved.setup_environment()
    return resolved


def set_up(strategy: Strategy, optimizer: str = "adamw") -> tuple[nn.Module, list[Any]]:
    """Build the model in the strategy's init context with the shared initial weights, and its optimizer."""
    weights = initial_weights()
    with strategy.module_init_context():
        model = RegressionNet()
    _copy_into(model, weights)
    model = strategy.setup_module(model)
    if optimizer == "adamw":
        optimizers = [torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)]
    elif optimizer == "cpu_adam":
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        optimizers = [DeepSpeedCPUAdam(model.parameters(), lr=LEARNING_RATE, weight_decay=0.01, adamw_mode=True)]
    elif optimizer == "from_config":
        optimizers = []
    else:
        raise ValueError(optimizer)
    return model, strategy.setup_optimizers(optimizers)


def _copy_into(model: nn.Module, weights: dict[str, torch.Tensor]) -> None:
    import deepspeed

    # Under zero.Init the parameters are already partitioned: gather, let rank 0 write, re-partition.
    with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=0), torch.no_grad():
        model.load_state_dict(weights)


def train_steps(
    strategy: Strategy, model: nn.Module, optimizers: list[Any], steps: int, start_step: int = 0
) -> list[float]:
    """Drive the strategy as the Trainer does; return the global mean loss of each step."""
    losses = []
    for batch in global_batches(start_step + steps, strategy.world_size)[start_step:]:
        local = strategy.batch_to_device(rank_slice(batch, strategy.global_rank))
        loss = strategy.run_step("training_step", local)
        strategy.backward(loss, optimizers[0])
        strategy.optimizer_step(optimizers[0])
        strategy.zero_grad(optimizers[0])
        losses.append(strategy.reduce(loss.detach().float(), "mean").item())
    return losses


def train(
    strategy: str | dict[str, Any], steps: int, precision: str = "32-true", optimizer: str = "adamw"
) -> tuple[list[float], dict[str, torch.Tensor], str]:
    """Train ``steps`` steps; return losses, the gathered weights (rank 0) and the optimizer's type."""
    resolved = create_strategy(strategy, precision)
    model, optimizers = set_up(resolved, optimizer)
    losses = train_steps(resolved, model, optimizers, steps)
    return losses, resolved.module_full_state_dict(), type(optimizers[0]).__name__


class NotATensor:
    """A custom object in a checkpoint: a weights-only load must refuse it."""

    def __init__(self, value: int) -> None:
        self.value = value


def train_and_save(
    strategy: str | dict[str, Any], steps: int, path: str, precision: str = "32-true", extra: Any = None
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Train ``steps`` steps and save; return the losses and the gathered weights at the save (rank 0)."""
    resolved = create_strategy(strategy, precision)
    model, optimizers = set_up(resolved)
    losses = train_steps(resolved, model, optimizers, steps)
    state = {"module": model, "optimizers": optimizers, "loops": {"step": steps}}
    if extra is not None:
        state["extra"] = extra
    resolved.save_checkpoint(path, state)
    return losses, resolved.module_full_state_dict()


def load_and_train(
    strategy: str | dict[str, Any],
    path: str,
    steps: int,
    start_step: int,
    precision: str = "32-true",
    with_optimizers: bool = True,
) -> tuple[dict[str, Any], dict[str, torch.Tensor], list[float], dict[str, torch.Tensor], list[str]]:
    """Load ``path`` into a fresh run, then train on; return the plain entries, the weights right after
    loading, the losses, the final weights and the warnings raised while loading."""
    import warnings

    resolved = create_strategy(strategy, precision)
    model, optimizers = set_up(resolved)
    state: dict[str, Any] = {"module": model}
    if with_optimizers:
        state["optimizers"] = optimizers
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        remaining = resolved.load_checkpoint(path, state)
    loaded = resolved.module_full_state_dict()
    losses = train_steps(resolved, model, optimizers, steps, start_step=start_step)
    messages = [str(warning.message) for warning in caught if "optimizer state" in str(warning.message)]
    return remaining, loaded, losses, resolved.module_full_state_dict(), messages


def save_twice(path: str, fail_second: bool) -> list[str]:
    """Save after 1 step and again after 2; the second save may carry an entry that cannot be pickled."""
    resolved = create_strategy("deepspeed_stage_2")
    model, optimizers = set_up(resolved)
    outcomes = []
    for step in range(2):
        train_steps(resolved, model, optimizers, 1, start_step=step)
        state = {"module": model, "optimizers": optimizers, "loops": {"step": step + 1}}
        if fail_second and step == 1:
            state["unpicklable"] = lambda: None
        try:
            resolved.save_checkpoint(path, state)
            outcomes.append("saved")
        except Exception as error:
            outcomes.append(f"{type(error).__name__}: {error}")
    return outcomes
