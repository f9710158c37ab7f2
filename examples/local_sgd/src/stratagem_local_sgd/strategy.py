"""Local SGD: every rank steps alone on its share of the data; parameters are averaged every K steps.

``ParallelStrategy`` gives the processes, the process group, the data split and the collectives;
it synchronises nothing by itself. This class adds the three things that make local SGD correct:

- :meth:`setup_module` broadcasts rank 0's weights, so that ranks start from the same model
  whatever each rank's random state was when it built the module;
- :meth:`optimizer_step` averages parameters and floating-point buffers every ``average_every``
  steps;
- a checkpoint holds the global state (the average of the ranks' weights, which any strategy or
  ``single_device`` loads) and, beside it, every rank's own weights, optimizer state and the
  steps since the last average, so that a run resumed on as many ranks continues exactly.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer
from torch.utils._pytree import tree_map

from stratagem.checkpoint_io import PathLike, read_full_checkpoint
from stratagem.strategies import ParallelStrategy
from stratagem.strategies.parallel import DEFAULT_TIMEOUT

LOCAL_STATE_KEY = "local_sgd"
"""The checkpoint entry holding each rank's own state; other strategies ignore it."""


class LocalSGDStrategy(ParallelStrategy):
    """One process per device; ranks step alone and average their parameters every ``average_every`` steps."""

    max_optimizers: ClassVar[int | None] = 1

    def __init__(
        self,
        average_every: int = 4,
        start_method: str = "popen",
        process_group_backend: str | None = None,
        timeout: timedelta | float = DEFAULT_TIMEOUT,
    ) -> None:
        if not isinstance(average_every, int) or isinstance(average_every, bool) or average_every < 1:
            raise ValueError(
                f"LocalSGDStrategy(average_every={average_every!r}) is not valid; expected a positive int "
                "(optimizer steps between two averages of the parameters)."
            )
        super().__init__(process_group_backend=process_group_backend, timeout=timeout, start_method=start_method)
        self.average_every = average_every
        self.steps_since_average = 0

    def setup_module(self, module: nn.Module) -> nn.Module:
        module = super().setup_module(module)
        with torch.no_grad(), self.collective("broadcast of rank 0's initial weights"):
            for tensor in module.state_dict().values():
                dist.broadcast(tensor, src=0)
        self.steps_since_average = 0
        return module

    def optimizer_step(self, optimizer: Optimizer) -> Any:
        result = super().optimizer_step(optimizer)
        self.steps_since_average += 1
        if self.steps_since_average == self.average_every:
            self.average_parameters()
        return result

    def average_parameters(self) -> None:
        """Replace every rank's parameters and floating-point buffers with their average over the ranks."""
        with torch.no_grad():
            self._average_in_place(list(self.module.state_dict().values()))
        self.steps_since_average = 0

    def module_full_state_dict(self) -> dict[str, Any]:
        return self._averaged_state(self.module)

    def save_checkpoint(self, path: PathLike, state: dict[str, Any]) -> None:
        checkpoint: dict[str, Any] = {}
        own: dict[str, Any] = {}
        for key, value in state.items():
            if isinstance(value, nn.Module):
                own[key] = _on_cpu(value.state_dict())
                checkpoint[key] = self._averaged_state(value)
            elif _holds_optimizers(value):
                # Optimizer state is not averaged: the global entry is rank 0's, for loaders that read only it.
                own[key] = _on_cpu(self._state_of(value))
                checkpoint[key] = own[key]
            else:
                checkpoint[key] = value
        every_rank = [None] * self.world_size
        with self.collective("all_gather_object of every rank's local state (save_checkpoint)"):
            dist.all_gather_object(every_rank, own)
        checkpoint[LOCAL_STATE_KEY] = {
            "world_size": self.world_size,
            "steps_since_average": self.steps_since_average,
            "ranks": every_rank,
        }
        self.write_on_rank_zero(
            lambda: self.checkpoint_io.save_checkpoint(checkpoint, path), f"Writing the checkpoint {str(path)!r}"
        )

    def load_checkpoint(
        self, path: PathLike, state: dict[str, Any], strict: bool = True, weights_only: bool = True
    ) -> dict[str, Any]:
        checkpoint = dict(read_full_checkpoint(path, self.checkpoint_io, weights_only=weights_only))
        saved = checkpoint.pop(LOCAL_STATE_KEY, None)
        resuming_fit = any(_holds_optimizers(value) for value in state.values())
        self.steps_since_average = 0
        # A resumed fit on as many ranks continues each rank's own state; weights for evaluation, or a
        # different world size, start from the average (as if an average had just been taken).
        if resuming_fit and saved is not None and saved["world_size"] == self.world_size:
            checkpoint.update(saved["ranks"][self.global_rank])
            self.steps_since_average = saved["steps_since_average"]
        for key, target in state.items():
            if isinstance(target, nn.Module):
                target.load_state_dict(checkpoint.pop(key), strict=strict)
            elif isinstance(target, Optimizer):
                target.load_state_dict(checkpoint.pop(key))
            elif _holds_optimizers(target):
                for optimizer, optimizer_state in zip(target, checkpoint.pop(key), strict=True):
                    optimizer.load_state_dict(optimizer_state)
        return checkpoint

    def _averaged_state(self, module: nn.Module) -> dict[str, Any]:
        """The average over the ranks of ``module``'s state, on the CPU; every rank gets it (a collective)."""
        averaged = {key: value.detach().clone() for key, value in module.state_dict().items()}
        self._average_in_place(list(averaged.values()))
        return _on_cpu(averaged)

    def _average_in_place(self, tensors: list[torch.Tensor]) -> None:
        with self.collective("all_reduce of the parameters (local SGD average)"):
            for tensor in tensors:
                if tensor.is_floating_point():
                    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
                    tensor.div_(self.world_size)
                else:
                    dist.broadcast(tensor, src=0)

    def __repr__(self) -> str:
        return f"LocalSGDStrategy(average_every={self.average_every}, devices={self.num_processes})"


def _holds_optimizers(value: Any) -> bool:
    return isinstance(value, Optimizer) or (
        isinstance(value, list | tuple) and bool(value) and isinstance(value[0], Optimizer)
    )


def _on_cpu(state: Any) -> Any:
    return tree_map(lambda value: value.detach().cpu() if isinstance(value, torch.Tensor) else value, state)
