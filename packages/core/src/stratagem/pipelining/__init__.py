"""Pipeline parallelism's backend-free parts: where a module is cut, the schedules by name, the stage modules
each rank holds, and the engine that runs them (used by ``stratagem-fsdp``'s ``pipeline`` strategy)."""

from typing import TYPE_CHECKING

from stratagem.exports import lazy_exports

if TYPE_CHECKING:
    from stratagem.pipelining.engine import PipelineEngine
    from stratagem.pipelining.schedules import SCHEDULES, ScheduleKind, check_schedule, schedule_kind
    from stratagem.pipelining.split import StageSplit, split_module
    from stratagem.pipelining.stage_modules import StageBlocks, hand_out_stages, keep_stages, stage_view

__all__ = [
    "SCHEDULES",
    "PipelineEngine",
    "ScheduleKind",
    "StageBlocks",
    "StageSplit",
    "check_schedule",
    "hand_out_stages",
    "keep_stages",
    "schedule_kind",
    "split_module",
    "stage_view",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "PipelineEngine": "stratagem.pipelining.engine",
        "SCHEDULES": "stratagem.pipelining.schedules",
        "ScheduleKind": "stratagem.pipelining.schedules",
        "check_schedule": "stratagem.pipelining.schedules",
        "schedule_kind": "stratagem.pipelining.schedules",
        "StageSplit": "stratagem.pipelining.split",
        "split_module": "stratagem.pipelining.split",
        "StageBlocks": "stratagem.pipelining.stage_modules",
        "hand_out_stages": "stratagem.pipelining.stage_modules",
        "keep_stages": "stratagem.pipelining.stage_modules",
        "stage_view": "stratagem.pipelining.stage_modules",
    },
    "stratagem",
)
