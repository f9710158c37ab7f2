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
        eval_micro_batches: int = 1,
    ) -> None:
        self.eval_micro_batches = eval_micro_batches
        self.views = list(views)
        self.stages = list(stages)
        self.num_stages = num_stages
        self.kind = kind
        self.group = group
        self.device = device
        self._pp = dist.get_world_size(group)
        self._pp_rank = dist.get_rank(group)
        self._schedules: dict[tuple[Any, ...], Any] = {}
        self._eval_schedules: dict[tuple[Any, ...], Any] = {}

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

    def _make_schedule(self, loss: LossFunction | None, micro_batches: int, schedule_class: Any = None) -> Any:
        from torch.distributed.pipelining import PipelineStage

        pipeline_stages = [
            PipelineStage(view, stage, self.num_stages, self.device, group=self.group)
            for view, stage in zip(self.views, self.stages, strict=True)
        ]
        schedule_class = self.kind.torch_schedule() if schedule_class is None else schedule_class
        first = pipeline_stages if self.kind.multi_stage else pipeline_stages[0]
        return schedule_class(first, n_microbatches=micro_batches, loss_fn=loss)

    def _eval_schedule(self, inputs: tuple[Any, ...]) -> Any:
        """A forward-only schedule (no loss: torch's schedules then run no backward) over this shape of batch:
        GPipe's all-forwards for one stage per rank, looped BFS for several; ``None`` for the V layout, whose
        placement of stages neither follows."""
        from torch.distributed.pipelining import schedules

        if self.kind.layout == "v":
            return None
        size = next((value.shape[0] for value in inputs if isinstance(value, torch.Tensor)), None)
        # A batch the count does not divide (an epoch's last) runs whole.
        count = self.eval_micro_batches if size is not None and size % self.eval_micro_batches == 0 else 1
        key = (count, *(_shape_of(value) for value in inputs))
        schedule = self._eval_schedules.get(key)
        if schedule is None:
            kind = schedules.ScheduleLoopedBFS if self.kind.multi_stage else schedules.ScheduleGPipe
            schedule = self._eval_schedules[key] = self._make_schedule(None, count, kind)
        return schedule

    def _from_stage(self, stage: int, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` as the rank holding ``stage`` has it, on every rank of the pipeline."""
        source = dist.get_global_rank(self.group, stage_rank(self.kind, stage, self._pp))
        tensor = tensor.contiguous()
        dist.broadcast(tensor, src=source, group=self.group)
        return tensor

    def forward(self, *inputs: Any) -> Any:
        """The whole model's output for ``inputs``, on every rank of the pipeline, forward only: the batch cut
        into ``eval_micro_batches`` that a forward-only schedule runs through the stages, then the last stage's
        output handed to all."""
        with torch.no_grad():
            schedule = self._eval_schedule(inputs)
            if schedule is None:
                return self._forward_stage_by_stage(inputs)
            returned = schedule.step(*inputs)
        # Only the rank holding the last stage has the merged output.
        output = [returned if self.holds_last_stage else None]
        source = dist.get_global_rank(self.group, stage_rank(self.kind, self.num_stages - 1, self._pp))
        dist.broadcast_object_list(output, src=source, group=self.group, device=self.device)
        return output[0]

    def _forward_stage_by_stage(self, inputs: tuple[Any, ...]) -> Any:
        """Each stage in turn on the rank that holds it, its output handed to all (the batch whole)."""
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
