"""Trainer overhead: stratagem's Trainer against a hand-written PyTorch loop (and Lightning, when installed).

    python tools/bench/run.py trainer [--workload mlp|transformer|all] [--rounds 5] [--json out.json]

Each workload trains the same model on the same data with the same optimizer, in rounds that
alternate the order of the contenders (raw, trainer, lightning / lightning, trainer, raw, ...),
after one warm-up round that is not counted. Steps/s are measured over the training loop only
(from the first batch to the last optimizer step; process start, model creation and setup are
outside). The ratio is the median over rounds of trainer/raw steps/s within a round.

The Trainer runs as a user would run it for speed: no progress bar, no logger, no checkpoints;
``training_step`` logs its loss with ``self.log`` as typical code does. Numbers on a machine
shared with other jobs are noisy: compare ratios from one run, not absolute steps/s across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional
from torch.utils.data import DataLoader, TensorDataset

import stratagem


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
    "mlp": Workload("mlp", "tiny MLP 32-64-64-2, batch 32", _mlp, _mlp_data, 32, 1500, 0.80),
    "transformer": Workload(
        "transformer",
        "transformer encoder, 4 layers, d_model 256, 4 heads, seq 64, batch 16",
        _Encoder,
        _transformer_data,
        16,
        12,
        0.97,
    ),
}


def _loader(workload: Workload, data: TensorDataset) -> DataLoader:
    return DataLoader(data, batch_size=workload.batch_size, shuffle=True, drop_last=True)


def _optimizer(parameters: Any) -> torch.optim.Optimizer:
    return torch.optim.Adam(parameters, lr=1e-3)


# -- contenders: each returns steps/s of its training loop ------------------------------------


def run_raw(workload: Workload, data: TensorDataset) -> float:
    torch.manual_seed(0)
    model = workload.make_model()
    optimizer = _optimizer(model.parameters())
    loader = _loader(workload, data)
    model.train()
    steps = 0
    start = time.perf_counter()
    while steps < workload.steps:
        for features, labels in loader:
            loss = functional.cross_entropy(model(features), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            steps += 1
            if steps == workload.steps:
                break
    return steps / (time.perf_counter() - start)


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


def run_trainer(workload: Workload, data: TensorDataset) -> float:
    torch.manual_seed(0)
    module = _BenchModule(workload.make_model())
    trainer = stratagem.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=workload.steps,
        enable_progress_bar=False,
        enable_checkpointing=False,
        logger=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, _loader(workload, data))
    return trainer.throughput.steps_per_second


def _lightning() -> Any:
    for name in ("lightning.pytorch", "pytorch_lightning"):
        try:
            return __import__(name, fromlist=["Trainer"])
        except ImportError:
            continue
    return None


def run_lightning(workload: Workload, data: TensorDataset) -> float:
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
        def on_train_start(self, trainer: Any, module: Any) -> None:
            self.start = time.perf_counter()

        def on_train_end(self, trainer: Any, module: Any) -> None:
            self.seconds = time.perf_counter() - self.start

    torch.manual_seed(0)
    timer = Timer()
    trainer = pl.Trainer(
        accelerator="cpu",
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
    return workload.steps / timer.seconds


# -- measuring ----------------------------------------------------------------------------------


def measure(workload: Workload, rounds: int, with_lightning: bool) -> dict[str, Any]:
    data = workload.make_data()
    contenders: dict[str, Callable[[Workload, TensorDataset], float]] = {"raw": run_raw, "trainer": run_trainer}
    if with_lightning:
        contenders["lightning"] = run_lightning
    names = list(contenders)
    for name in names:
        contenders[name](workload, data)  # warm-up: first-call costs (allocator, lazy imports) are not overhead
    samples: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        order = names if index % 2 == 0 else names[::-1]
        for name in order:
            samples[name].append(contenders[name](workload, data))
    ratios = {
        name: statistics.median(value / raw for value, raw in zip(samples[name], samples["raw"]))
        for name in names
        if name != "raw"
    }
    return {
        "workload": workload.name,
        "description": workload.description,
        "steps_per_round": workload.steps,
        "rounds": rounds,
        "steps_per_second": {name: statistics.median(values) for name, values in samples.items()},
        "samples": samples,
        "ratio_to_raw": ratios,
        "target": workload.target,
        "meets_target": ratios["trainer"] >= workload.target,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="run.py trainer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=[*WORKLOADS, "all"], default="all")
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds per workload (default: 5)")
    parser.add_argument("--steps", type=int, default=None, help="steps per round (default: per workload)")
    parser.add_argument("--no-lightning", action="store_true", help="skip Lightning even when it is installed")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args(argv)
    with_lightning = not args.no_lightning and _lightning() is not None
    names = list(WORKLOADS) if args.workload == "all" else [args.workload]
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} intra-op thread(s) "
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
        verdict = "meets" if result["meets_target"] else "MISSES"
        print(f"{workload.description}\n  {columns}\n  {ratios}  ({verdict} target {workload.target:.2f})")
    if args.json:
        with open(args.json, "w") as stream:
            json.dump(results, stream, indent=2)
    return 0 if all(result["meets_target"] for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
