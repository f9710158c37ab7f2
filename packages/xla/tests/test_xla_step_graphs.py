"""How single_xla cuts the traced graph, counted from XLA's own metrics (PJRT_DEVICE=CPU).

One cut per step, where the loop asks for the next batch: a second one after the optimizer step would find
nothing left to run and wait for the device instead, so the next step could not be traced while this one
runs (measured: 0.85x the steps/s of torch_xla's own loop).
"""

from __future__ import annotations

import io
from typing import Any

import torch_xla.debug.metrics as met
from xla_testing import Regression, loader, weights

from stratagem import Trainer
from stratagem.callbacks import Callback, ProgressBar

# Counters: graph cuts (``torch_xla.sync``, ``mark_step``) and graph executions. Metrics (counted by their
# number of samples): compilations and reads of device values into host memory.
COUNTERS = ("MarkStep", "ExecuteComputation")
METRICS = ("CompileTime", "TransferFromDeviceTime")
WARMUP_STEPS = 4


def xla_counts() -> dict[str, int]:
    counts = {name: met.counter_value(name) or 0 for name in COUNTERS}
    for name in METRICS:
        data = met.metric_data(name)
        counts[name] = int(data[0]) if data else 0
    return counts


def counted_since(before: dict[str, int]) -> dict[str, int]:
    now = xla_counts()
    return {name: now[name] - before[name] for name in now}


class StepCounts(Callback):
    """XLA's counts between the end of training batch ``WARMUP_STEPS`` and the end of the last one."""

    def __init__(self) -> None:
        self.before: dict[str, int] | None = None
        self.counts: dict[str, int] = {}
        self.steps = 0

    def on_train_batch_end(self, trainer: Trainer, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx + 1 == WARMUP_STEPS:
            self.before = xla_counts()
        elif self.before is not None:
            self.steps += 1
            self.counts = counted_since(self.before)


def _trainer(tmp_path, *callbacks: Callback, **options: Any) -> Trainer:
    # The bar and the logger are on and the module logs its loss every step; the bar's refresh interval and the
    # logger's only keep their own reads (one each per interval, by design) out of the counted window.
    return Trainer(
        strategy="single_xla",
        default_root_dir=tmp_path,
        callbacks=[ProgressBar(stream=io.StringIO(), print_seconds=3600), *callbacks],
        log_every_n_steps=1000,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        **options,
    )


def test_each_training_step_is_cut_once_and_runs_one_compiled_graph_without_reading_the_device(tmp_path):
    counts = StepCounts()
    _trainer(tmp_path, counts, max_epochs=1).fit(Regression(), loader(batch_size=2))
    steps = counts.steps
    assert steps == len(loader(batch_size=2)) - WARMUP_STEPS
    # Each counted batch was asked for after a step, whose graph the cut then ran.
    assert counts.counts == {
        "MarkStep": steps,
        "ExecuteComputation": steps,
        "CompileTime": 0,
        "TransferFromDeviceTime": 0,
    }


def test_a_fit_stopped_by_max_steps_runs_its_last_step_as_the_graph_every_step_compiled_to(tmp_path):
    _trainer(tmp_path / "warmup", max_epochs=1).fit(Regression(), loader(batch_size=2))
    module = Regression()
    before = xla_counts()
    _trainer(tmp_path / "stopped", max_steps=WARMUP_STEPS + 3).fit(module, loader(batch_size=2))
    weights(module)
    assert counted_since(before)["CompileTime"] == 0
