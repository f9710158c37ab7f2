"""Trainer overhead: stratagem's Trainer against a hand-written PyTorch loop (and Lightning, when installed).

    python tools/bench/run.py trainer [--workload mlp|transformer|all] [--rounds 5] [--json out.json]
    python tools/bench/run.py trainer --accelerator cuda       # every contender on the first GPU
    python tools/bench/run.py trainer --paired 3000

Each workload trains the same model on the same data with the same optimizer, in rounds that
alternate the order of the contenders (raw, trainer, lightning / lightning, trainer, raw, ...),
after one warm-up round that is not counted. Steps/s are measured over the training loop only
(from the first batch to the last optimizer step; process start, model creation and setup are
outside), by the wall clock and by this process's CPU time. The ratio is the median over
rounds of trainer/raw within a round. The target is judged on wall-clock steps/s; the CPU-time
ratio is printed beside it because it is far less disturbed by other jobs on a shared machine.

The Trainer runs as a user would run it for speed: no progress bar, no logger, no checkpoints;
``training_step`` logs its loss with ``self.log`` as typical code does. Numbers on a machine
shared with other jobs are noisy: compare ratios from one run, not absolute steps/s across runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional
from torch.utils.data import DataLoader, TensorDataset

import stratagem
import stratagem.callbacks


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    make_model: Callable[[], nn.Module]
    make_data: Callable[[], TensorDataset]
    batch_size: int
    steps: int
    target: float


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))


def _mlp_data() -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(8192, 32, generator=generator)
    return TensorDataset(features, (features[:, 0] > 0).long())


class _Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024, batch_first=True, dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False)
        self.head = nn.Linear(256, 2)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(inputs).mean(dim=1))


def _transformer_data() -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(512, 64, 256, generator=generator)
    return TensorDataset(inputs, (inputs[:, 0, 0] > 0).long())


WORKLOADS = {
    "mlp": Workload("mlp", "tiny MLP 32-64-64-2, batch 32", _mlp, _mlp_data, 32, 1500, 0.97),
    "transformer": Workload(
        "transformer",
        "transformer encoder, 4 layers, d_model 256, 4 heads, seq 64, batch 16",
        _Encoder,
        _transformer_data,
        16,
        8,
        0.97,
    ),
}


def _loader(workload: Workload, data: TensorDataset) -> DataLoader:
    return DataLoader(data, batch_size=workload.batch_size, shuffle=True, drop_last=True)


def _optimizer(parameters: Any) -> torch.optim.Optimizer:
    return torch.optim.Adam(parameters, lr=1e-3)


# -- contenders: each returns the steps/s of its training loop (wall clock, CPU time) ---------

ACCELERATOR = "cpu"
"""Where every contender trains (``--accelerator``): ``cpu``, or ``cuda`` for the first GPU."""


class Stopwatch:
    """Wall-clock and CPU time between start() and stop(); on a GPU, of the work queued until then too."""

    def start(self) -> None:
        _synchronize()
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def stop(self) -> None:
        _synchronize()
        self.wall, self.cpu = time.perf_counter() - self._wall, time.process_time() - self._cpu

    def rates(self, steps: int) -> tuple[float, float]:
        return steps / self.wall, steps / self.cpu


def _synchronize() -> None:
    if ACCELERATOR == "cuda":
        torch.cuda.synchronize()


def run_raw(workload: Workload, data: TensorDataset) -> tuple[float, float]:
    torch.manual_seed(0)
    device = torch.device(ACCELERATOR)
    model = workload.make_model().to(device)
    optimizer = _optimizer(model.parameters())
    loader = _loader(workload, data)
    model.train()
    steps = 0
    stopwatch = Stopwatch()
    stopwatch.start()
    while steps < workload.steps:
        for features, labels in loader:
            features, labels = features.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            loss = functional.cross_entropy(model(features), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            steps += 1
            if steps == workload.steps:
                break
    stopwatch.stop()
    return stopwatch.rates(steps)


class _BenchModule(stratagem.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        features, labels = batch
        loss = functional.cross_entropy(self.model(features), labels)
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return _optimizer(self.parameters())


class _StopwatchCallback(stratagem.callbacks.Callback):
    """Times the training loop only; it has no per-batch hook, so it adds nothing per step."""

    def __init__(self) -> None:
        self.stopwatch = Stopwatch()

    def on_train_start(self, trainer: Any, module: Any) -> None:
        self.stopwatch.start()

    def on_train_end(self, trainer: Any, module: Any) -> None:
        self.stopwatch.stop()


def run_trainer(workload: Workload, data: TensorDataset) -> tuple[float, float]:
    torch.manual_seed(0)
    module = _BenchModule(workload.make_model())
    timer = _StopwatchCallback()
    trainer = stratagem.Trainer(
        accelerator=ACCELERATOR,
        devices=1,
        max_steps=workload.steps,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        logger=False,
        num_sanity_val_steps=0,
        callbacks=[timer],
    )
    trainer.fit(module, _loader(workload, data))
    return timer.stopwatch.rates(trainer.global_step)


def _lightning() -> Any:
    for name in ("lightning.pytorch", "pytorch_lightning"):
        try:
            module = __import__(name, fromlist=["Trainer"])
        except ImportError:
            continue
        logging.getLogger(name).setLevel(logging.ERROR)
        return module
    return None


def run_lightning(workload: Workload, data: TensorDataset) -> tuple[float, float]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _run_lightning(workload, data)


def _run_lightning(workload: Workload, data: TensorDataset) -> tuple[float, float]:
    pl = _lightning()

    class LightningBenchModule(pl.LightningModule):
        def __init__(self, model: nn.Module) -> None:
            super().__init__()
            self.model = model

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            features, labels = batch
            loss = functional.cross_entropy(self.model(features), labels)
            self.log("loss", loss, prog_bar=True)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return _optimizer(self.parameters())

    class Timer(pl.Callback):
        def __init__(self) -> None:
            self.stopwatch = Stopwatch()

        def on_train_start(self, trainer: Any, module: Any) -> None:
            self.stopwatch.start()

        def on_train_end(self, trainer: Any, module: Any) -> None:
            self.stopwatch.stop()

    torch.manual_seed(0)
    timer = Timer()
    trainer = pl.Trainer(
        accelerator=ACCELERATOR,
        devices=1,
        max_steps=workload.steps,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        logger=False,
        num_sanity_val_steps=0,
        callbacks=[timer],
    )
    trainer.fit(LightningBenchModule(workload.make_model()), _loader(workload, data))
    return timer.stopwatch.rates(trainer.global_step)


# -- paired: both loops step by step in one process, features on -------------------------------


class _PairedRawLoop(stratagem.callbacks.Callback):
    """Runs one raw step after every Trainer step and times both, so that each pair of samples sees the
    same machine load: the median difference is the Trainer's per-step overhead even on a busy machine."""

    def __init__(self, workload: Workload, data: TensorDataset) -> None:
        torch.manual_seed(0)
        self.model = workload.make_model()
        self.optimizer = _optimizer(self.model.parameters())
        self.workload, self.data = workload, data
        self.batches = iter(())
        # The last raw step's batch and loss, held until the next raw step replaces them, as the variables of
        # a raw loop are: freeing them (the loss frees its autograd nodes) is part of a raw step, and would
        # otherwise happen as this hook returns, inside the Trainer's timing.
        self.held: tuple[Any, ...] = ()
        self.trainer_steps: list[float] = []
        self.raw_steps: list[float] = []
        self.last: float | None = None

    def _next_batch(self) -> Any:
        batch = next(self.batches, None)
        if batch is None:
            self.batches = iter(_loader(self.workload, self.data))
            batch = next(self.batches)
        return batch

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        now = time.perf_counter()
        if self.last is not None:
            self.trainer_steps.append(now - self.last)
        start = time.perf_counter()
        raw_batch = self._next_batch()
        features, labels = raw_batch
        loss = functional.cross_entropy(self.model(features), labels)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.held = (raw_batch, features, labels, loss)
        end = time.perf_counter()
        self.raw_steps.append(end - start)
        self.last = time.perf_counter()


def measure_paired(workload: Workload, steps: int, root_dir: str) -> dict[str, Any]:
    """Trainer with the progress bar on and a CSV logger every 50 steps, paired step by step with a raw loop."""
    data = workload.make_data()
    paired = _PairedRawLoop(workload, data)
    torch.manual_seed(0)
    trainer = stratagem.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        enable_progress_bar=True,
        enable_checkpointing=False,
        logger="csv",
        log_every_n_steps=50,
        num_sanity_val_steps=0,
        default_root_dir=root_dir,
        callbacks=[paired],
    )
    trainer.fit(_BenchModule(workload.make_model()), _loader(workload, data))
    warm_up = min(200, steps // 4)
    trainer_step = statistics.median(paired.trainer_steps[warm_up:])
    raw_step = statistics.median(paired.raw_steps[warm_up + 1 :])
    return {
        "workload": workload.name,
        "steps": steps,
        "trainer_step_us": trainer_step * 1e6,
        "raw_step_us": raw_step * 1e6,
        "overhead_us": (trainer_step - raw_step) * 1e6,
        "ratio_to_raw": raw_step / trainer_step,
    }


# -- measuring ----------------------------------------------------------------------------------


def measure(workload: Workload, rounds: int, with_lightning: bool) -> dict[str, Any]:
    data = workload.make_data()
    contenders: dict[str, Callable[[Workload, TensorDataset], tuple[float, float]]] = {
        "raw": run_raw,
        "trainer": run_trainer,
    }
    if with_lightning:
        contenders["lightning"] = run_lightning
    names = list(contenders)
    for name in names:
        contenders[name](workload, data)  # warm-up: first-call costs (allocator, lazy imports) are not overhead
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        order = names if index % 2 == 0 else names[::-1]
        for name in order:
            wall_rate, cpu_rate = contenders[name](workload, data)
            wall[name].append(wall_rate)
            cpu[name].append(cpu_rate)

    def ratios(samples: dict[str, list[float]]) -> dict[str, float]:
        return {
            name: statistics.median(value / raw for value, raw in zip(samples[name], samples["raw"]))
            for name in names
            if name != "raw"
        }

    wall_ratios = ratios(wall)
    return {
        "workload": workload.name,
        "description": workload.description,
        "steps_per_round": workload.steps,
        "rounds": rounds,
        "steps_per_second": {name: statistics.median(values) for name, values in wall.items()},
        "steps_per_cpu_second": {name: statistics.median(values) for name, values in cpu.items()},
        "samples_wall": wall,
        "samples_cpu": cpu,
        "ratio_to_raw": wall_ratios,
        "ratio_to_raw_cpu_time": ratios(cpu),
        "target": workload.target,
        "meets_target": wall_ratios["trainer"] >= workload.target,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="run.py trainer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=[*WORKLOADS, "all"], default="all")
    parser.add_argument("--rounds", type=int, default=7, help="measured rounds per workload (default: 7)")
    parser.add_argument("--steps", type=int, default=None, help="steps per round (default: per workload)")
    parser.add_argument("--no-lightning", action="store_true", help="skip Lightning even when it is installed")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    parser.add_argument("--accelerator", choices=("cpu", "cuda"), default="cpu", help="where to train (default: cpu)")
    parser.add_argument(
        "--paired",
        type=int,
        default=None,
        metavar="STEPS",
        help="instead: STEPS Trainer steps with the progress bar and a CSV logger on, each followed by one raw step "
        "in the same process; prints the median per-step overhead (robust on a busy machine)",
    )
    args = parser.parse_args(argv)
    if args.paired is not None and args.accelerator != "cpu":
        parser.error("--paired measures the CPU; leave --accelerator out")
    global ACCELERATOR
    ACCELERATOR = args.accelerator
    if args.paired is not None:
        import tempfile

        with tempfile.TemporaryDirectory() as root_dir:
            result = measure_paired(WORKLOADS["mlp"], args.paired, root_dir)
        print(
            f"paired, {WORKLOADS['mlp'].description}, progress bar on, CSV logger every 50 steps: trainer "
            f"{result['trainer_step_us']:.1f} us/step, raw {result['raw_step_us']:.1f} us/step, overhead "
            f"{result['overhead_us']:.1f} us/step, raw/trainer {result['ratio_to_raw']:.3f}"
        )
        if args.json:
            with open(args.json, "w") as stream:
                json.dump(result, stream, indent=2)
        return 0
    with_lightning = not args.no_lightning and _lightning() is not None
    names = list(WORKLOADS) if args.workload == "all" else [args.workload]
    print(
        f"torch {torch.__version__} on {ACCELERATOR}, {torch.get_num_threads()} intra-op thread(s) "
        f"(OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}), "
        f"lightning: {'yes' if with_lightning else 'not installed'}"
    )
    results = []
    for name in names:
        workload = WORKLOADS[name]
        if args.steps is not None:
            workload = Workload(**{**workload.__dict__, "steps": args.steps})
        result = measure(workload, args.rounds, with_lightning)
        results.append(result)
        rates = result["steps_per_second"]
        columns = "  ".join(f"{contender} {rate:8.1f} steps/s" for contender, rate in rates.items())
        ratios = "  ".join(f"{contender}/raw {ratio:.3f}" for contender, ratio in result["ratio_to_raw"].items())
        cpu_ratios = "  ".join(
            f"{contender}/raw {ratio:.3f}" for contender, ratio in result["ratio_to_raw_cpu_time"].items()
        )
        verdict = "meets" if result["meets_target"] else "MISSES"
        print(
            f"{workload.description}\n  {columns}\n  wall clock: {ratios}  ({verdict} target {workload.target:.2f})"
            f"\n  CPU time:   {cpu_ratios}"
        )
    if args.json:
        with open(args.json, "w") as stream:
            json.dump(results, stream, indent=2)
    return 0 if all(result["meets_target"] for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
