"""ThroughputMonitor: samples, tokens and FLOPs per second, model FLOPs utilisation and each rank's peak memory."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from stratagem.callbacks.callback import Callback, RunStage

if TYPE_CHECKING:
    from stratagem.module import Module
    from stratagem.trainer.trainer import Trainer

MIB = 2**20


class ThroughputMonitor(Callback):
    """Log how fast training runs, every ``log_every_n_steps`` optimizer steps, over the steps since the last log.

    - ``throughput/batches_per_sec``: this rank's batches (micro-batches when accumulating);
    - ``throughput/samples_per_sec``: samples over all data-parallel ranks (ranks that split one batch, as tensor
      parallel ones do, count it once), each batch's counted by ``batch_size_fn`` (default: the first dimension
      of its first tensor);
    - ``throughput/tokens_per_sec``: likewise, when ``tokens_fn(batch)`` says how many tokens a batch has;
    - ``throughput/flops_per_sec`` per device, when ``flops_per_batch`` gives the FLOPs of one training step on one
      rank's batch, forward and backward (a number, or a function of the batch; :func:`measure_flops` counts
      them), and ``throughput/mfu``, that divided by ``peak_flops``, one device's peak FLOP/s at the precision
      trained in;
    - ``memory/peak_mib/rank<r>``: each rank's peak memory since training started, as its accelerator counts it
      (CUDA's allocator; on the CPU the peak resident memory).

    The latest figures are in :attr:`figures`, and those of the whole training loop, once it ended, in
    :attr:`run_figures`. Every rank takes part (one small exchange per log); the loggers get them from rank 0.
    """

    def __init__(
        self,
        batch_size_fn: Callable[[Any], int] | None = None,
        tokens_fn: Callable[[Any], int] | None = None,
        flops_per_batch: float | Callable[[Any], float] | None = None,
        peak_flops: float | None = None,
        log_every_n_steps: int | None = None,
    ) -> None:
        for name, value in (("batch_size_fn", batch_size_fn), ("tokens_fn", tokens_fn)):
            if value is not None and not callable(value):
                raise TypeError(f"ThroughputMonitor({name}={value!r}) is not valid; expected a function of the batch.")
        if flops_per_batch is not None and not callable(flops_per_batch):
            _positive("flops_per_batch", flops_per_batch)
        if peak_flops is not None:
            _positive("peak_flops", peak_flops)
            if flops_per_batch is None:
                raise ValueError(
                    "ThroughputMonitor(peak_flops=...) needs flops_per_batch too: MFU is FLOP/s over peak."
                )
        if log_every_n_steps is not None and (isinstance(log_every_n_steps, bool) or log_every_n_steps < 1):
            raise ValueError(f"ThroughputMonitor(log_every_n_steps={log_every_n_steps!r}) is not valid; expected >= 1.")
        self.batch_size_fn = batch_size_fn or first_dimension
        self.tokens_fn = tokens_fn
        self.flops_per_batch = flops_per_batch
        self.peak_flops = peak_flops
        self.log_every_n_steps = log_every_n_steps
        self.figures: dict[str, float] = {}
        self.run_figures: dict[str, float] = {}
        self._window = _Counts()
        self._run = _Counts()
        self._last_step: int | None = None

    def setup(self, trainer: Trainer, module: Module, stage: RunStage) -> None:
        self.figures, self.run_figures = {}, {}

    def on_train_start(self, trainer: Trainer, module: Module) -> None:
        trainer.strategy.accelerator.synchronize(trainer.strategy.root_device)
        self._window = _Counts()
        self._run = _Counts()
        self._last_step = trainer.global_step

    def on_train_batch_end(self, trainer: Trainer, module: Module, outputs: Any, batch: Any, batch_idx: int) -> None:
        samples = self.batch_size_fn(batch)
        tokens = self.tokens_fn(batch) if self.tokens_fn is not None else 0
        flops = self.flops_per_batch(batch) if callable(self.flops_per_batch) else self.flops_per_batch or 0.0
        for counts in (self._window, self._run):
            counts.add(samples, tokens, flops)
        step = trainer.global_step
        every = self.log_every_n_steps or trainer.settings.log_every_n_steps
        if step != self._last_step and step % every == 0:
            self._last_step = step
            self.figures = self._figures(trainer, self._window)
            self._window = _Counts()
            trainer.log_to_loggers(self.figures)

    def on_train_end(self, trainer: Trainer, module: Module) -> None:
        self.run_figures = self._figures(trainer, self._run)

    def _figures(self, trainer: Trainer, counts: _Counts) -> dict[str, float]:
        strategy = trainer.strategy
        strategy.accelerator.synchronize(strategy.root_device)
        seconds = max(time.perf_counter() - counts.started, 1e-9)
        peak = strategy.accelerator.peak_memory_bytes(strategy.root_device)
        mine = [counts.samples, counts.tokens, counts.flops, -1.0 if peak is None else float(peak)]
        if strategy.world_size == 1:
            per_rank = [mine]
        else:
            gathered = strategy.all_gather(torch.tensor(mine, dtype=torch.float64, device=strategy.root_device))
            per_rank = gathered.reshape(strategy.world_size, len(mine)).tolist()
        sampler = strategy.distributed_sampler_kwargs
        replicas = sampler["num_replicas"] if sampler is not None else 1
        # Ranks that share one data-parallel slot (tensor parallel) train on the same samples.
        ranks_per_replica = max(1, strategy.world_size // replicas)
        figures = {
            "throughput/batches_per_sec": counts.batches / seconds,
            "throughput/samples_per_sec": sum(row[0] for row in per_rank) / ranks_per_replica / seconds,
        }
        if self.tokens_fn is not None:
            figures["throughput/tokens_per_sec"] = sum(row[1] for row in per_rank) / ranks_per_replica / seconds
        if self.flops_per_batch is not None:
            flops_per_second = sum(row[2] for row in per_rank) / len(per_rank) / seconds
            figures["throughput/flops_per_sec"] = flops_per_second
            if self.peak_flops is not None:
                figures["throughput/mfu"] = flops_per_second / self.peak_flops
        for rank, row in enumerate(per_rank):
            if row[3] >= 0:
                figures[f"memory/peak_mib/rank{rank}"] = row[3] / MIB
        return figures


class _Counts:
    """What the batches since ``started`` added up to on this rank."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.batches = 0
        self.samples = 0
        self.tokens = 0
        self.flops = 0.0

    def add(self, samples: int, tokens: int, flops: float) -> None:
        self.batches += 1
        self.samples += samples
        self.tokens += tokens
        self.flops += flops


def first_dimension(batch: Any) -> int:
    """The length of the first dimension of the first tensor in ``batch`` (a tensor, or sequences and mappings of
    them): the number of samples in the usual batch."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() > 0 else 1
    items = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, Sequence) else ()
    for item in items:
        if isinstance(item, torch.Tensor | Mapping) or (isinstance(item, Sequence) and not isinstance(item, str)):
            try:
                return first_dimension(item)
            except TypeError:
                continue
    raise TypeError(
        f"ThroughputMonitor found no tensor in a batch of type {type(batch).__name__} to count its samples; pass "
        "batch_size_fn=lambda batch: <the number of samples>."
    )


def measure_flops(step: Callable[[], Any]) -> int:
    """The FLOPs ``step()`` runs (call the model's forward and, for a training step, ``backward`` on its loss), as
    torch's FLOP counter counts matrix products and convolutions. Run it on the meta device to count for free."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        step()
    return int(counter.get_total_flops())


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"ThroughputMonitor({name}={value!r}) is not valid; expected a number > 0.")
