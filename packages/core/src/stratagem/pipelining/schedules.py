"""Pipeline schedules by name: which torch schedule runs, how many stages each rank holds, and where.

Each name maps to a schedule class of ``torch.distributed.pipelining``. Single-stage schedules give every
pipeline rank one stage; the interleaved ones give it ``stages_per_rank`` stages, laid out in a loop
(rank ``r`` holds stages ``r, r + pp, r + 2 pp, ...``) or, for the V-shaped ones, as ``r`` and
``2 pp - 1 - r`` (the first rank holds the first and the last stage). What torch refuses about the
micro-batch count is checked here, before any process starts.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Literal

Layout = Literal["loop", "v"]


@dataclass(frozen=True)
class ScheduleKind:
    """One named schedule: its torch class and how it places stages on ranks."""

    torch_class: str
    """The class's name in ``torch.distributed.pipelining.schedules``."""
    description: str
    multi_stage: bool
    layout: Layout = "loop"
    fixed_stages_per_rank: int | None = None
    """Stages per rank the schedule requires, where it requires a number."""

    def default_stages_per_rank(self) -> int:
        if self.fixed_stages_per_rank is not None:
            return self.fixed_stages_per_rank
        return 2 if self.multi_stage else 1

    def torch_schedule(self) -> Any:
        from torch.distributed.pipelining import schedules

        return getattr(schedules, self.torch_class)


SCHEDULES: dict[str, ScheduleKind] = {
    "gpipe": ScheduleKind(
        "ScheduleGPipe", "all forwards, then all backwards: simplest, most activations in flight", False
    ),
    "1f1b": ScheduleKind(
        "Schedule1F1B", "one forward, one backward in turn: at most pp micro-batches' activations in flight", False
    ),
    "interleaved_1f1b": ScheduleKind(
        "ScheduleInterleaved1F1B", "1f1b over several stages per rank (looped): a smaller bubble", True
    ),
    "looped_bfs": ScheduleKind(
        "ScheduleLoopedBFS", "every micro-batch through a rank's first stage, then its next (looped)", True
    ),
    "interleaved_zero_bubble": ScheduleKind(
        "ScheduleInterleavedZeroBubble",
        "interleaved 1f1b with backward split into input and weight gradients to fill the bubble",
        True,
    ),
    "zbv_zero_bubble": ScheduleKind(
        "ScheduleZBVZeroBubble", "zero bubble on a V: two stages per rank, the first rank holds both ends", True, "v", 2
    ),
}


def schedule_kind(name: str) -> ScheduleKind:
    """The schedule called ``name``; ``ValueError`` naming the close matches and every name otherwise."""
    kind = SCHEDULES.get(name) if isinstance(name, str) else None
    if kind is None:
        close = difflib.get_close_matches(str(name).lower(), SCHEDULES, n=2)
        hint = f" Did you mean {' or '.join(repr(match) for match in close)}?" if close else ""
        raise ValueError(f"pipeline_schedule={name!r} is not a schedule.{hint} Expected one of {sorted(SCHEDULES)}.")
    return kind


def check_schedule(name: str, pp: int, stages_per_rank: int | None, micro_batches: int) -> int:
    """Raise ``ValueError`` where torch's schedule ``name`` cannot run ``micro_batches`` over ``pp`` ranks;
    return the stages each rank holds."""
    kind = schedule_kind(name)
    per_rank = kind.default_stages_per_rank() if stages_per_rank is None else stages_per_rank
    if isinstance(per_rank, bool) or not isinstance(per_rank, int) or per_rank < 1:
        raise ValueError(f"stages_per_rank={per_rank!r} is not valid; expected a positive int.")
    if not kind.multi_stage and per_rank != 1:
        raise ValueError(
            f"pipeline_schedule={name!r} runs one stage per rank, not stages_per_rank={per_rank}. For several "
            f"stages per rank use one of {sorted(key for key, other in SCHEDULES.items() if other.multi_stage)}."
        )
    if kind.fixed_stages_per_rank is not None and per_rank != kind.fixed_stages_per_rank:
        raise ValueError(
            f"pipeline_schedule={name!r} runs exactly {kind.fixed_stages_per_rank} stages per rank, not "
            f"stages_per_rank={per_rank}."
        )
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
        raise ValueError(f"micro_batches={micro_batches!r} is not valid; expected a positive int.")
    if name == "1f1b" and micro_batches < pp:
        raise ValueError(
            f"pipeline_schedule='1f1b' needs at least as many micro-batches as stages: micro_batches={micro_batches} "
            f"with pp={pp}. Use micro_batches >= {pp}."
        )
    if kind.multi_stage:
        rounds = max(1, micro_batches // pp)
        if micro_batches % rounds:
            raise ValueError(
                f"pipeline_schedule={name!r} runs micro-batches in rounds of pp={pp}: micro_batches={micro_batches} "
                f"is not a multiple of its {rounds} rounds. Use a multiple of pp, or fewer than pp."
            )
    return per_rank


def rank_stages(kind: ScheduleKind, pp_rank: int, pp: int, stages_per_rank: int) -> list[int]:
    """The stage indices the pipeline rank ``pp_rank`` holds, in increasing order."""
    if kind.layout == "v":
        return sorted((pp_rank, 2 * pp - 1 - pp_rank))
    return [pp_rank + round_ * pp for round_ in range(stages_per_rank)]


def stage_rank(kind: ScheduleKind, stage: int, pp: int) -> int:
    """The pipeline rank that holds stage ``stage``."""
    if kind.layout == "v":
        return stage if stage < pp else 2 * pp - 1 - stage
    return stage % pp
