"""FSDP's host memory default: steps/s and CPU time per step against raw fully_shard, and peak RSS either way.

    python tools/bench/run.py fsdp_host_memory [--workload tiny|small|all] [--rounds 3] [--json out.json]

Every contender runs in 2 fresh CPU processes (gloo) of its own, with the C allocator's own settings
(no ``MALLOC_*`` variables), so one contender's allocator choice never reaches another:

- ``raw``: a hand-written loop over the model sharded with ``fully_shard`` directly (each block a unit);
- ``fsdp``: ``FSDPStrategy`` with the same units and its default ``release_host_memory=None``, driven as
  the Trainer drives it (``run_step`` / ``backward`` / ``optimizer_step`` / ``zero_grad``);
- ``fsdp_release``: the same with ``release_host_memory=True`` (freed memory goes back to the system at once).

Workloads: ``tiny`` is an MLP 32-64-64-2 (batch 32 per process), ``small`` a transformer encoder of 4
layers, d_model 256, 4 heads, sequence 64 (batch 16 per process); Adam. Rounds alternate the order of the
contenders; ratios are the median over rounds of contender/raw within a round. Rank 0 reports wall-clock
steps/s and CPU seconds per step after the warm-up; every rank reports its peak RSS (``ru_maxrss``). CPU time
is far less disturbed by other jobs on the machine than wall-clock time: compare ratios from one run.
Target: ``fsdp`` at least 0.97x raw's steps/s on both workloads.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _ranks import run_ranks

WORLD_SIZE = 2
SPEED_TARGET = 0.97
CONTENDERS = ("raw", "fsdp", "fsdp_release")


@dataclass(frozen=True)
class Workload:
    description: str
    steps: int
    warmup: int


WORKLOADS = {
    "tiny": Workload("MLP 32-64-64-2, batch 32 per process", 300, 30),
    "small": Workload("transformer encoder, 4 layers, d_model 256, 4 heads, seq 64, batch 16 per process", 24, 4),
}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python tools/bench/run.py fsdp_host_memory", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--workload", choices=(*WORKLOADS, "all"), default="all")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per workload (default: 3)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        return _worker(json.loads(args.worker))
    if args.rounds < 1:
        parser.error(f"--rounds={args.rounds} must be at least 1.")
    print(f"load average at start: {' '.join(f'{load:.1f}' for load in os.getloadavg())} on {os.cpu_count()} CPUs")
    names = list(WORKLOADS) if args.workload == "all" else [args.workload]
    results: dict[str, Any] = {}
    ok = True
    for name in names:
        rounds = []
        for round_index in range(args.rounds):
            order = CONTENDERS if round_index % 2 == 0 else tuple(reversed(CONTENDERS))
            rounds.append({contender: _contender(name, contender) for contender in order})
        summary = _summary(rounds)
        results[name] = {"rounds": rounds, "summary": summary}
        ok &= summary["fsdp"]["steps_ratio"] >= SPEED_TARGET
        print(_report(name, summary), flush=True)
    print(f"load average at end: {' '.join(f'{load:.1f}' for load in os.getloadavg())}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return 0 if ok else 1


# -- the calling process ------------------------------------------------------------------------


def _contender(workload: str, contender: str) -> dict[str, Any]:
    """Both ranks of one contender as fresh processes; rank 0's timings and every rank's peak RSS."""
    # Allocator settings from the caller's shell are dropped: each contender sets its own in the worker.
    spec = {"workload": workload, "contender": contender}
    ranks = run_ranks("fsdp_host_memory", spec, WORLD_SIZE, set_rank=True, drop_env_prefixes=("MALLOC_",))
    return {**ranks[0], "peak_rss_bytes": [rank["peak_rss_bytes"] for rank in ranks]}


def _summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    summary = {}
    for contender in CONTENDERS:
        runs = [one_round[contender] for one_round in rounds]
        summary[contender] = {
            "steps_per_s": statistics.median(run["steps_per_s"] for run in runs),
            "cpu_s_per_step": statistics.median(run["cpu_s_per_step"] for run in runs),
            "peak_rss_mib": max(max(run["peak_rss_bytes"]) for run in runs) / 2**20,
            "steps_ratio": statistics.median(
                one_round[contender]["steps_per_s"] / one_round["raw"]["steps_per_s"] for one_round in rounds
            ),
            # Steps per CPU-second against raw's: above 1 is faster.
            "cpu_ratio": statistics.median(
                one_round["raw"]["cpu_s_per_step"] / one_round[contender]["cpu_s_per_step"] for one_round in rounds
            ),
        }
    return summary


def _report(name: str, summary: dict[str, Any]) -> str:
    lines = [f"{name}: {WORKLOADS[name].description}"]
    for contender, row in summary.items():
        lines.append(
            f"  {contender:<12} {row['steps_per_s']:7.2f} steps/s ({row['steps_ratio']:.3f}x raw)  "
            f"{1000 * row['cpu_s_per_step']:7.2f} CPU ms/step ({row['cpu_ratio']:.3f}x raw's steps per CPU-s)  "
            f"peak RSS {row['peak_rss_mib']:.0f} MiB/rank"
        )
    ratio = summary["fsdp"]["steps_ratio"]
    lines.append(
        f"  fsdp steps/s {ratio:.3f}x raw (target >= {SPEED_TARGET}) {'OK' if ratio >= SPEED_TARGET else 'MISSED'}"
    )
    return "\n".join(lines)


# -- in each rank -------------------------------------------------------------------------------


def _model(workload: str) -> Any:
    import torch
    from torch import nn
    from torch.nn import functional

    class Classifier(nn.Module):
        def training_step(self, batch: tuple[Any, Any]) -> Any:
            inputs, targets = batch
            return functional.cross_entropy(self(inputs), targets)

    class MLP(Classifier):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))

        def forward(self, inputs: Any) -> Any:
            return self.layers(inputs)

    class Encoder(Classifier):
        def __init__(self) -> None:
            super().__init__()
            layer = nn.TransformerEncoderLayer(
                d_model=256, nhead=4, dim_feedforward=1024, batch_first=True, dropout=0.0
            )
            self.encoder = nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False)
            self.head = nn.Linear(256, 2)

        def forward(self, inputs: Any) -> Any:
            return self.head(self.encoder(inputs).mean(dim=1))

    torch.manual_seed(0)
    return MLP() if workload == "tiny" else Encoder()


def _unit_type(workload: str) -> Any:
    from torch import nn

    return nn.Linear if workload == "tiny" else nn.TransformerEncoderLayer


def _batches(workload: str, rank: int) -> list[tuple[Any, Any]]:
    import torch

    generator = torch.Generator().manual_seed(rank)
    shape = (32, 32) if workload == "tiny" else (16, 64, 256)
    batches = []
    for _ in range(4):
        inputs = torch.randn(*shape, generator=generator)
        batches.append((inputs, (inputs.flatten(1)[:, 0] > 0).long()))
    return batches


def _worker(spec: dict[str, Any]) -> int:
    import torch

    workload, contender = spec["workload"], spec["contender"]
    rank = int(os.environ["RANK"])
    batches = _batches(workload, rank)
    step = _raw_stepper(workload) if contender == "raw" else _strategy_stepper(workload, contender == "fsdp_release")

    plan = WORKLOADS[workload]
    for index in range(plan.warmup):
        step(batches[index % len(batches)])
    torch.distributed.barrier()
    wall, cpu = time.perf_counter(), time.process_time()
    for index in range(plan.steps):
        step(batches[index % len(batches)])
    torch.distributed.barrier()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    report = {
        "steps_per_s": plan.steps / wall,
        "cpu_s_per_step": cpu / plan.steps,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    Path(spec["out"]).write_text(json.dumps(report))
    torch.distributed.destroy_process_group()
    return 0


def _raw_stepper(workload: str) -> Any:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (WORLD_SIZE,))
    module = _model(workload)
    for unit in [submodule for submodule in module.modules() if isinstance(submodule, _unit_type(workload))]:
        fully_shard(unit, mesh=mesh)
    fully_shard(module, mesh=mesh)
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-3)

    def step(batch: Any) -> None:
        module.training_step(batch).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def _strategy_stepper(workload: str, release: bool) -> Any:
    import torch

    import stratagem
    from stratagem_fsdp import FSDPStrategy

    network = _model(workload)
    chosen = FSDPStrategy(auto_wrap_policy={_unit_type(workload)}, release_host_memory=True if release else None)
    strategy = stratagem.resolve(strategy=chosen, accelerator="cpu", devices=WORLD_SIZE)
    strategy.setup_environment()
    module = strategy.setup_module(network)
    [optimizer] = strategy.setup_optimizers([torch.optim.Adam(module.parameters(), lr=1e-3)])

    def step(batch: Any) -> None:
        loss = strategy.run_step("training_step", batch)
        strategy.backward(loss, optimizer)
        strategy.optimizer_step(optimizer)
        strategy.zero_grad(optimizer)

    return step
