"""FSDP: model-state bytes and peak RSS per rank against DDP, and steps/s against raw fully_shard.

    python tools/bench/run.py fsdp [--steps 10] [--rounds 5] [--release-host-memory default|true|false]
                                   [--json out.json]

Each contender starts 2 fresh CPU processes (gloo) that build the same ~21M-parameter MLP
(five 2048x2048 linear layers) with AdamW through the strategy (``fsdp`` with each linear
layer its own unit, and ``ddp``), and take three optimizer steps driven as the Trainer drives
them (``run_step`` / ``backward`` / ``optimizer_step``). Each rank then reports, before the
gradients are cleared:

- model-state bytes: every distinct tensor storage it holds for parameters, gradients and
  optimizer state (the local shards under FSDP);
- peak RSS of the process (``ru_maxrss``), with ``MALLOC_MMAP_THRESHOLD_=65536 MALLOC_ARENA_MAX=2``
  so that glibc returns freed memory to the system.

Speed: in the fsdp processes, after the memory is recorded, the strategy and a hand-written
loop over the same model sharded with ``fully_shard`` directly (same units, same data)
alternate rounds of ``--steps`` steps after a warm-up (who goes first alternates too); the
ratio is the median of the per-round ratios. Numbers taken while other jobs use the CPUs are noisy: compare ratios from
one run, not absolute steps/s across runs.

``--release-host-memory`` is passed to ``FSDPStrategy(release_host_memory=...)`` (``default``: left out, which
releases only when host memory is tight); run it once per choice to compare their peak RSS. The setting is
per process, so the raw loop beside the strategy runs under it too.

Targets: fsdp's model-state bytes per rank at most 0.55x ddp's; steps/s at least 0.95x raw.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from pathlib import Path
from typing import Any

from _ranks import run_ranks

WORLD_SIZE = 2
_ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_ARENA_MAX": "2"}
"""glibc giving freed memory back at once, so peak RSS is what the ranks held."""
WIDTH = 2048
LAYERS = 5
MICRO_BATCH = 8
MEMORY_TARGET = 0.55
SPEED_TARGET = 0.95
CONTENDERS = ("ddp", "fsdp")
RELEASE_CHOICES = {"default": None, "true": True, "false": False}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python tools/bench/run.py fsdp", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round (default: 10)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per contender (default: 5)")
    parser.add_argument(
        "--release-host-memory",
        choices=sorted(RELEASE_CHOICES),
        default="default",
        help="FSDPStrategy's release_host_memory (default: left out)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        return _worker(json.loads(args.worker))
    if args.steps < 1 or args.rounds < 1:
        parser.error(f"--steps={args.steps} and --rounds={args.rounds} must be at least 1.")
    results = {}
    for contender in CONTENDERS:
        spec = {
            "contender": contender,
            "steps": args.steps,
            "rounds": args.rounds,
            "release_host_memory": RELEASE_CHOICES[args.release_host_memory],
        }
        results[contender] = {"ranks": run_ranks("fsdp", spec, WORLD_SIZE, env=_ALLOCATOR)}
        print(_row(contender, results[contender]), flush=True)
    report = _report(results)
    print(report["summary"])
    if args.json is not None:
        args.json.write_text(json.dumps({"results": results, **report}, indent=2))
    return 0 if report["ok"] else 1


# -- the calling process ------------------------------------------------------------------------


def _row(contender: str, result: dict[str, Any]) -> str:
    ranks = result["ranks"]
    model_state = " / ".join(f"{rank['model_state_bytes'] / 2**20:.1f}" for rank in ranks)
    peak_rss = " / ".join(f"{rank['peak_rss_bytes'] / 2**20:.0f}" for rank in ranks)
    return (
        f"{contender:<5} parameters {ranks[0]['parameters']:,}  model-state MiB/rank {model_state}  "
        f"peak RSS MiB/rank {peak_rss}"
        + (f"  releases host memory: {ranks[0]['releases_host_memory']}" if "releases_host_memory" in ranks[0] else "")
    )


def _report(results: dict[str, Any]) -> dict[str, Any]:
    def worst(contender: str, key: str) -> int:
        return max(rank[key] for rank in results[contender]["ranks"])

    memory = worst("fsdp", "model_state_bytes") / worst("ddp", "model_state_bytes")
    rss = worst("fsdp", "peak_rss_bytes") / worst("ddp", "peak_rss_bytes")
    speed = results["fsdp"]["ranks"][0]["speed"]
    memory_ok, speed_ok = memory <= MEMORY_TARGET, speed["ratio"] >= SPEED_TARGET
    lines = [
        f"model-state bytes per rank: fsdp {memory:.3f}x ddp (target <= {MEMORY_TARGET}) "
        f"{'OK' if memory_ok else 'MISSED'}",
        f"peak RSS per rank: fsdp {rss:.3f}x ddp (reported beside the count; no target)",
        f"steps/s: strategy {speed['strategy_steps_per_s']:.2f}, raw fully_shard {speed['raw_steps_per_s']:.2f}, "
        f"ratio {speed['ratio']:.3f} (target >= {SPEED_TARGET}) {'OK' if speed_ok else 'MISSED'}; per-round ratios "
        f"{', '.join(f'{ratio:.3f}' for ratio in speed['round_ratios'])}",
    ]
    return {
        "summary": "\n".join(lines),
        "ok": memory_ok and speed_ok,
        "memory_ratio": memory,
        "rss_ratio": rss,
        "speed_ratio": speed["ratio"],
    }


# -- in each rank -------------------------------------------------------------------------------


def _network() -> Any:
    from torch import nn

    class Network(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS))

        def forward(self, x: Any) -> Any:
            for layer in self.layers:
                x = nn.functional.gelu(layer(x))
            return x

        def training_step(self, batch: Any) -> Any:
            return self(batch).pow(2).mean()

    return Network


def _worker(spec: dict[str, Any]) -> int:
    import torch
    from torch import nn

    import stratagem
    from stratagem_fsdp import FSDPStrategy

    network = _network()
    release = spec["release_host_memory"]
    fsdp = FSDPStrategy(auto_wrap_policy={nn.Linear}, release_host_memory=release)
    chosen: Any = fsdp if spec["contender"] == "fsdp" else "ddp"
    strategy = stratagem.resolve(strategy=chosen, accelerator="cpu", devices=WORLD_SIZE)
    strategy.setup_environment()
    torch.manual_seed(0)
    with strategy.module_init_context():
        module = network()
    strategy.setup_module(module)
    [optimizer] = strategy.setup_optimizers([torch.optim.AdamW(module.parameters(), lr=1e-4)])
    generator = torch.Generator().manual_seed(strategy.global_rank)
    batches = [torch.randn(MICRO_BATCH, WIDTH, generator=generator) for _ in range(4)]
    for batch in batches[:3]:
        _strategy_step(strategy, optimizer, batch, zero_grad=False)
    report: dict[str, Any] = {
        "rank": strategy.global_rank,
        "parameters": sum(parameter.numel() for parameter in module.parameters()),
        "model_state_bytes": _model_state_bytes(module, optimizer),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    strategy.zero_grad(optimizer)
    if spec["contender"] == "fsdp":
        report["releases_host_memory"] = strategy.releases_host_memory
        report["speed"] = _compare_speed(strategy, optimizer, batches, spec["steps"], spec["rounds"])
    Path(spec["out"]).write_text(json.dumps(report))
    strategy.teardown()
    return 0


def _strategy_step(strategy: Any, optimizer: Any, batch: Any, zero_grad: bool = True) -> None:
    loss = strategy.run_step("training_step", batch)
    strategy.backward(loss, optimizer)
    strategy.optimizer_step(optimizer)
    if zero_grad:
        strategy.zero_grad(optimizer)


def _model_state_bytes(module: Any, optimizer: Any) -> int:
    """Bytes of the distinct storages behind this rank's parameters, gradients and optimizer state."""
    import torch

    tensors = [parameter for parameter in module.parameters()]
    tensors += [parameter.grad for parameter in module.parameters() if parameter.grad is not None]
    tensors += [value for state in optimizer.state.values() for value in state.values() if torch.is_tensor(value)]
    storages: dict[int, int] = {}
    for tensor in tensors:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        storage = local.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def _compare_speed(strategy: Any, optimizer: Any, batches: list[Any], steps: int, rounds: int) -> dict[str, Any]:
    """Rounds of the strategy's loop and of a raw fully_shard loop on the same model, alternating."""
    import torch
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    raw = _network()()
    for layer in raw.layers:
        fully_shard(layer, mesh=strategy.device_mesh)
    fully_shard(raw, mesh=strategy.device_mesh)
    raw_optimizer = torch.optim.AdamW(raw.parameters(), lr=1e-4)

    def raw_step(batch: Any) -> None:
        raw.training_step(batch).backward()
        raw_optimizer.step()
        raw_optimizer.zero_grad(set_to_none=True)

    def timed(step: Any) -> float:
        strategy.barrier("benchmark round")
        start = time.perf_counter()
        for index in range(steps):
            step(batches[index % len(batches)])
        strategy.barrier("benchmark round")
        return steps / (time.perf_counter() - start)

    for batch in batches[:2]:
        _strategy_step(strategy, optimizer, batch)
        raw_step(batch)
    strategy_rates, raw_rates = [], []
    for round_index in range(rounds):
        # Who goes first alternates, so that a slowdown that builds up within a round hits both alike.
        if round_index % 2 == 0:
            strategy_rates.append(timed(lambda batch: _strategy_step(strategy, optimizer, batch)))
            raw_rates.append(timed(raw_step))
        else:
            raw_rates.append(timed(raw_step))
            strategy_rates.append(timed(lambda batch: _strategy_step(strategy, optimizer, batch)))
    ratios = [ours / theirs for ours, theirs in zip(strategy_rates, raw_rates)]
    return {
        "strategy_steps_per_s": statistics.median(strategy_rates),
        "raw_steps_per_s": statistics.median(raw_rates),
        "ratio": statistics.median(ratios),
        "round_ratios": ratios,
    }
