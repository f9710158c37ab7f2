"""XLA: single_xla steps/s against a hand-written torch_xla loop, and graph compilations per step after warm-up.

    PJRT_DEVICE=CPU python tools/bench/run.py xla [--steps 40] [--rounds 5] [--json out.json]

Needs the xla environment (torch 2.9.0 with torch-xla 2.9.0, stratagem-xla installed); runs on whatever
PJRT device ``PJRT_DEVICE`` names (XLA's CPU device here). Both contenders train the same MLP (four 512x512
linear layers, batch 64, SGD) on the same synthetic data in one process:

- ``single_xla``: ``Trainer(strategy="single_xla").fit`` with ``max_steps=--steps``, the module logging its
  loss every step (``self.log``), steps/s as the fit loop measures it (``trainer.throughput``);
- raw: the loop torch_xla's documentation writes, ``MpDeviceLoader`` feeding ``forward/backward`` and
  ``xm.optimizer_step``, timed over the same steps, ending with ``torch_xla.sync(wait=True)``.

A warm-up round of each compiles their graphs; then rounds alternate (who goes first alternates too) and the
ratio is the median of the per-round ratios. ``cpu_time_ratio`` compares the process CPU time of each whole
call (the Trainer's setup included, which favours raw), which other jobs on the machine disturb less.
Compilations are counted from XLA's ``CompileTime`` metric over
the timed rounds: after warm-up both must compile nothing per step (each step's graph is the one compiled
before). Numbers taken while other jobs use the CPUs are noisy: compare the ratio, not absolute steps/s.

Targets: steps/s at least 0.95x raw; compilations per step after warm-up equal to raw's (zero).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

WIDTH = 512
LAYERS = 4
BATCH = 64
SPEED_TARGET = 0.95


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python tools/bench/run.py xla", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps per timed round")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per contender")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    results = run(args.steps, args.rounds)
    print(json.dumps(results, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return 0 if results["meets_speed_target"] and results["meets_compile_target"] else 1


def run(steps: int, rounds: int) -> dict[str, Any]:
    import torch_xla

    torch_xla.device()
    run_trainer(steps)
    run_raw(steps)
    speeds: dict[str, list[float]] = {"single_xla": [], "raw": []}
    cpu_seconds: dict[str, list[float]] = {"single_xla": [], "raw": []}
    compiles: dict[str, int] = {"single_xla": 0, "raw": 0}
    for index in range(rounds):
        order = ("single_xla", "raw") if index % 2 == 0 else ("raw", "single_xla")
        for contender in order:
            before, cpu_before = compilations(), time.process_time()
            speed = run_trainer(steps) if contender == "single_xla" else run_raw(steps)
            cpu_seconds[contender].append(time.process_time() - cpu_before)
            compiles[contender] += compilations() - before
            speeds[contender].append(speed)
    ratios = [ours / raw for ours, raw in zip(speeds["single_xla"], speeds["raw"], strict=True)]
    ratio = statistics.median(ratios)
    cpu_ratios = [raw / ours for ours, raw in zip(cpu_seconds["single_xla"], cpu_seconds["raw"], strict=True)]
    per_step = {name: count / (steps * rounds) for name, count in compiles.items()}
    return {
        "steps_per_round": steps,
        "rounds": rounds,
        "steps_per_second": {name: statistics.median(values) for name, values in speeds.items()},
        "ratio": ratio,
        "ratios": ratios,
        "cpu_time_ratio": statistics.median(cpu_ratios),
        "cpu_time_ratios": cpu_ratios,
        "compilations_per_step_after_warmup": per_step,
        "target_ratio": SPEED_TARGET,
        "meets_speed_target": ratio >= SPEED_TARGET,
        "meets_compile_target": per_step["single_xla"] <= per_step["raw"],
    }


def compilations() -> int:
    import torch_xla.debug.metrics as met

    data = met.metric_data("CompileTime")
    return int(data[0]) if data else 0


def _model() -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(WIDTH, 1))


def _loader(steps: int) -> Any:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    generator = torch.Generator().manual_seed(1)
    features = torch.randn(steps * BATCH, WIDTH, generator=generator)
    targets = torch.randn(steps * BATCH, 1, generator=generator)
    return DataLoader(TensorDataset(features, targets), batch_size=BATCH)


def run_trainer(steps: int) -> float:
    import torch
    from torch.nn import functional

    from stratagem import Module, Trainer

    class Bench(Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = _model()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            features, targets = batch
            loss = functional.mse_loss(self.net(features), targets)
            self.log("loss", loss)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    trainer = Trainer(
        strategy="single_xla",
        max_steps=steps,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(Bench(), _loader(steps))
    return trainer.throughput.steps_per_second


def run_raw(steps: int) -> float:
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.parallel_loader as pl
    from torch.nn import functional

    device = torch_xla.device()
    model = _model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = pl.MpDeviceLoader(_loader(steps), device)
    start = time.perf_counter()
    for features, targets in loader:
        optimizer.zero_grad(set_to_none=True)
        loss = functional.mse_loss(model(features), targets)
        loss.backward()
        xm.optimizer_step(optimizer)
    torch_xla.sync(wait=True)
    return steps / (time.perf_counter() - start)
