"""Running a rank's pipeline stages: training steps through a torch schedule, forward-only passes for evaluation."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from stratagem.pipelining.schedules import ScheduleKind, stage_rank

LossFunction = Callable[[Any, Any], torch.Tensor]


class PipelineEngine:
    """A rank's stage modules (:func:`~stratagem.pipelining.stage_modules.stage_view`) on the ``"pp"`` group.

    A torch ``PipelineStage`` learns its activations' shapes from its first micro-batch, so each shape of
    batch gets its own stages and schedule, made on first use (an epoch's last, shorter batch, say).
    """

    def __init__(
        self,
        views: Sequence[nn.Module],
        stages: Sequence[int],
        num_stages: int,
        kind: ScheduleKind,
        group: Any,
        device: torch.device,
    ) -> None:
        self.views = list(views)
        self.stages = list(stages)
        self.num_stages = num_stages
        self.kind = kind
        self.group = group
        self.device = device
        self._pp = dist.get_world_size(group)
        self._pp_rank = dist.get_rank(group)
        self._schedules: dict[tuple[Any, ...], Any] = {}

    @property
    def holds_last_stage(self) -> bool:
        return self.num_stages - 1 in self.stages

    def train_step(self, inputs: tuple[Any, ...], target: Any, loss: LossFunction, micro_batches: int) -> torch.Tensor:
        """Forward and backward of one batch over ``micro_batches`` (gradients are the batch mean's, as ``loss``
        of every micro-batch is a mean); the mean loss on every rank of the pipeline."""
        key = (micro_batches, *(_shape_of(value) for value in (*inputs, target)))
        schedule = self._schedules.get(key)
        if schedule is None:
            schedule = self._schedules[key] = self._make_schedule(loss, micro_batches)
        losses: list[torch.Tensor] = []
        # Every rank passes the whole batch: the first stage reads the inputs, the last the target, others neither.
        schedule.step(*inputs, target=target, losses=losses)
        # In float64 on every rank: the ranks without the last stage cannot know the loss's dtype (the precision's).
        mean = torch.stack(losses).detach().double().mean() if losses else torch.zeros((), device=self.device)
        return self._from_stage(self.num_stages - 1, mean.double())

    def _make_schedule(self, loss: LossFunction, micro_batches: int) -> Any:
        from torch.distributed.pipelining import PipelineStage

        pipeline_stages = [
            PipelineStage(view, stage, self.num_stages, self.device, group=self.group)
            for view, stage in zip(self.views, self.stages, strict=True)
        ]
        schedule_class = self.kind.torch_schedule()
        first = pipeline_stages if self.kind.multi_stage else pipeline_stages[0]
        return schedule_class(first, n_microbatches=micro_batches, loss_fn=loss)

    def _from_stage(self, stage: int, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` as the rank holding ``stage`` has it, on every rank of the pipeline."""
        source = dist.get_global_rank(self.group, stage_rank(self.kind, stage, self._pp))
        tensor = tensor.contiguous()
        dist.broadcast(tensor, src=source, group=self.group)
        return tensor

    def forward(self, *inputs: Any) -> Any:
        """The whole model's output for ``inputs``, on every rank of the pipeline: each stage in turn runs on
        the rank that holds it, and hands its output to all (forward only, the batch whole)."""
        values: tuple[Any, ...] = inputs
        for stage in range(self.num_stages):
            holder = stage_rank(self.kind, stage, self._pp)
            output = [self.views[self.stages.index(stage)](*values).detach()] if holder == self._pp_rank else [None]
            source = dist.get_global_rank(self.group, holder)
            dist.broadcast_object_list(output, src=source, group=self.group, device=self.device)
            values = (output[0],)
        return values[0]


def _shape_of(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.dtype)
    return type(value)
