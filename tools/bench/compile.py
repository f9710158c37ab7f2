"""torch.compile: steps/s compiled and uncompiled under single_device, ddp and fsdp, against hand-written loops.

    python tools/bench/run.py compile [--steps 10] [--rounds 5] [--backend inductor] [--json out.json]

For each strategy, fresh CPU processes (1 for single_device, 2 with gloo for ddp and fsdp) build the same
model (four residual MLP blocks of width 256) twice with the same seed: once through the strategy, driven as
the Trainer drives it (``run_step`` / ``backward`` / ``optimizer_step`` / ``zero_grad``), and once by hand in
plain torch (the module itself, ``DistributedDataParallel``, or ``fully_shard`` on each block and the root).

1. uncompiled: rounds of ``--steps`` steps alternate between the strategy's loop and the eager hand-written one;
2. compiled: the strategy compiles the blocks (``strategy.compile_module``, what ``Trainer(compile={"blocks":
   Block})`` does; under fsdp the blocks are its wrap policy's units), the hand-written loop compiles the same
   blocks in place (``block.compile()``, as torchtitan does), each is warmed up until compiled, and rounds
   alternate again (who goes first alternates too).

Each ratio is the median of the per-round ratios, of wall-clock and of rank 0's CPU time. Numbers taken
while other jobs use the CPUs are noisy: compare ratios from one run, not absolute steps/s across runs.

Target: the strategy's compiled loop at least 0.97x the hand-written compiled loop, under each strategy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from _ranks import run_ranks

WIDTH = 256
BLOCKS = 4
MICRO_BATCH = 32
WARMUP_STEPS = 3
SPEED_TARGET = 0.97
CONTENDERS = {"single_device": 1, "ddp": 2, "fsdp": 2}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python tools/bench/run.py compile", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round (default: 10)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per loop (default: 5)")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend (default: inductor)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        return _worker(json.loads(args.worker))
    if args.steps < 1 or args.rounds < 1:
        parser.error(f"--steps={args.steps} and --rounds={args.rounds} must be at least 1.")
    results = {}
    for contender, world_size in CONTENDERS.items():
        spec = {"contender": contender, "steps": args.steps, "rounds": args.rounds, "backend": args.backend}
        results[contender] = run_ranks("compile", spec, world_size, timeout_s=3600)[0]
        print(_row(contender, results[contender]), flush=True)
    ok = all(result["compiled"]["ratio"] >= SPEED_TARGET for result in results.values())
    print(f"target: compiled strategy >= {SPEED_TARGET}x the hand-written compiled loop: {'OK' if ok else 'MISSED'}")
    if args.json is not None:
        args.json.write_text(json.dumps({"results": results, "ok": ok}, indent=2))
    return 0 if ok else 1


# -- the calling process ------------------------------------------------------------------------


def _row(contender: str, result: dict[str, Any]) -> str:
    eager, compiled = result["eager"], result["compiled"]
    return (
        f"{contender}\n"
        f"  uncompiled: strategy {eager['strategy_steps_per_s']:.1f} steps/s, by hand {eager['raw_steps_per_s']:.1f}: "
        f"{eager['ratio']:.3f}x wall, {eager['cpu_ratio']:.3f}x CPU time\n"
        f"  compiled:   strategy {compiled['strategy_steps_per_s']:.1f} steps/s, by hand "
        f"{compiled['raw_steps_per_s']:.1f}: {compiled['ratio']:.3f}x wall, {compiled['cpu_ratio']:.3f}x CPU time "
        f"(rounds {', '.join(f'{ratio:.2f}' for ratio in compiled['round_ratios'])})\n"
        f"  compiled/uncompiled: strategy {compiled['strategy_steps_per_s'] / eager['strategy_steps_per_s']:.2f}x, "
        f"by hand {compiled['raw_steps_per_s'] / eager['raw_steps_per_s']:.2f}x; first compiled steps: strategy "
        f"{result['warmup_s']['strategy']:.1f} s (compiles first), by hand {result['warmup_s']['raw']:.1f} s "
        "(finds dynamo's and inductor's caches filled)"
    )


# -- in each rank -------------------------------------------------------------------------------


def _model() -> Any:
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(WIDTH)
            self.up = nn.Linear(WIDTH, 4 * WIDTH)
            self.down = nn.Linear(4 * WIDTH, WIDTH)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.down(nn.functional.gelu(self.up(self.norm(x))))

    class Network(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(BLOCKS))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for block in self.blocks:
                x = block(x)
            return x

        def training_step(self, batch: torch.Tensor) -> torch.Tensor:
            return self(batch).pow(2).mean()

    return Network, Block


def _worker(spec: dict[str, Any]) -> int:
    import torch
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    import stratagem
    from stratagem.strategies import CompileSettings
    from stratagem_fsdp import FSDPStrategy

    network, block = _model()
    contender = spec["contender"]
    chosen: Any = FSDPStrategy(auto_wrap_policy={block}) if contender == "fsdp" else contender
    strategy = stratagem.resolve(strategy=chosen, accelerator="cpu", devices=CONTENDERS[contender])
    strategy.setup_environment()
    torch.manual_seed(0)
    with strategy.module_init_context(empty_init=False):
        module = network()
    strategy.setup_module(module)
    [optimizer] = strategy.setup_optimizers([torch.optim.AdamW(module.parameters(), lr=1e-4)])

    torch.manual_seed(0)
    raw = network()
    if contender == "fsdp":
        for unit in raw.blocks:
            fully_shard(unit, mesh=strategy.device_mesh)
        fully_shard(raw, mesh=strategy.device_mesh)
        raw_model: Any = raw
    elif contender == "ddp":
        raw_model = DistributedDataParallel(raw)
    else:
        raw_model = raw
    raw_optimizer = torch.optim.AdamW(raw.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(strategy.global_rank)
    batches = [torch.randn(MICRO_BATCH, WIDTH, generator=generator) for _ in range(4)]

    def strategy_step(batch: Any) -> None:
        loss = strategy.run_step("training_step", batch)
        strategy.backward(loss, optimizer)
        strategy.optimizer_step(optimizer)
        strategy.zero_grad(optimizer)

    def raw_step(batch: Any) -> None:
        raw_model(batch).pow(2).mean().backward()
        raw_optimizer.step()
        raw_optimizer.zero_grad(set_to_none=True)

    def warm_up(step: Any) -> float:
        strategy.barrier("warm-up")
        start = time.perf_counter()
        for batch in batches[:WARMUP_STEPS]:
            step(batch)
        strategy.barrier("warm-up")
        return time.perf_counter() - start

    def timed(step: Any) -> tuple[float, float]:
        """Steps per second of wall-clock time and of this process's CPU time (far less disturbed by other load)."""
        strategy.barrier("benchmark round")
        start, cpu_start = time.perf_counter(), time.process_time()
        for index in range(spec["steps"]):
            step(batches[index % len(batches)])
        cpu = time.process_time() - cpu_start
        strategy.barrier("benchmark round")
        return spec["steps"] / (time.perf_counter() - start), spec["steps"] / cpu

    def compare() -> dict[str, Any]:
        strategy_rates, raw_rates = [], []
        for round_index in range(spec["rounds"]):
            # Who goes first alternates, so that a slowdown that builds up within a round hits both alike.
            if round_index % 2 == 0:
                strategy_rates.append(timed(strategy_step))
                raw_rates.append(timed(raw_step))
            else:
                raw_rates.append(timed(raw_step))
                strategy_rates.append(timed(strategy_step))
        ratios = [ours[0] / theirs[0] for ours, theirs in zip(strategy_rates, raw_rates)]
        cpu_ratios = [ours[1] / theirs[1] for ours, theirs in zip(strategy_rates, raw_rates)]
        return {
            "strategy_steps_per_s": statistics.median(rate for rate, _ in strategy_rates),
            "raw_steps_per_s": statistics.median(rate for rate, _ in raw_rates),
            "ratio": statistics.median(ratios),
            "cpu_ratio": statistics.median(cpu_ratios),
            "round_ratios": ratios,
        }

    warm_up(strategy_step)
    warm_up(raw_step)
    report: dict[str, Any] = {"eager": compare()}
    options = {"backend": spec["backend"]}
    # Under fsdp the blocks are left to the strategy (its wrap policy's units), elsewhere named.
    blocks = None if contender == "fsdp" else (block,)
    strategy.compile_module(
        CompileSettings(compiler=lambda function: torch.compile(function, **options), blocks=blocks)
    )
    for unit in raw.blocks:
        unit.compile(**options)
    report["warmup_s"] = {"strategy": warm_up(strategy_step), "raw": warm_up(raw_step)}
    report["compiled"] = compare()
    if strategy.is_global_zero:
        Path(spec["out"]).write_text(json.dumps(report))
    strategy.teardown()
    return 0
