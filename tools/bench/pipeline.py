"""Pipeline: steps/s of the pipeline strategy against a hand-written torch.distributed.pipelining loop.

    python tools/bench/run.py pipeline [--schedule 1f1b] [--steps 5] [--rounds 5] [--json out.json]

Two CPU processes (gloo) each build the same GPT-style decoder (8 blocks, width 256, sequence 64,
batch 16, 4 micro-batches) twice: once through ``PipelineStrategy`` (cut evenly over ``pp=2``,
driven as the Trainer drives it: ``batch_to_device`` then ``run_training_steps``), once by hand
(each rank keeps its blocks in a plain module, wraps it in a ``PipelineStage`` and calls the same
torch schedule, then AdamW's step; both hand the loss to every rank). Rounds of ``--steps`` steps
alternate between the two after a warm-up of 3 steps each, who goes first alternating too; the ratio
is the median of the per-round ratios. The strategy logs nothing here (``log_loss_as=None``): that
is the Trainer's cost. Numbers taken while other jobs use the CPUs are noisy: compare ratios from one
run, not steps/s across runs.

Target: the strategy at least 0.97x the hand-written loop's steps/s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from _ranks import run_ranks

SPEED_TARGET = 0.97
WIDTH = 256
DEPTH = 8
SEQUENCE = 64
VOCAB = 512
BATCH = 16
MICRO_BATCHES = 4
WARM_UP_STEPS = 3
SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python tools/bench/run.py pipeline", description=__doc__.splitlines()[0])
    parser.add_argument("--schedule", choices=sorted(SCHEDULES), default="1f1b", help="the schedule (default: 1f1b)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per round (default: 5)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per contender (default: 5)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        spec = json.loads(args.worker)
        measured = _measure(spec["schedule"], spec["steps"], spec["rounds"])
        Path(spec["out"]).write_text(json.dumps(measured))
        return 0
    if args.steps < 1 or args.rounds < 1:
        parser.error(f"--steps={args.steps} and --rounds={args.rounds} must be at least 1.")
    result = run_ranks("pipeline", {"schedule": args.schedule, "steps": args.steps, "rounds": args.rounds}, 2)[0]
    ratio = statistics.median(result["ratios"])
    ok = ratio >= SPEED_TARGET
    print(f"{'contender':<14}{'steps/s (median round)':>24}")
    print(f"{'pipeline':<14}{statistics.median(result['strategy']):>24.2f}")
    print(f"{'hand-written':<14}{statistics.median(result['hand']):>24.2f}")
    print(
        f"pipeline / hand-written ({args.schedule}): {ratio:.3f}x (median of {args.rounds} rounds; "
        f"target >= {SPEED_TARGET}x): {'ok' if ok else 'BELOW TARGET'}"
    )
    if args.json is not None:
        args.json.write_text(json.dumps({**result, "ratio": ratio, "schedule": args.schedule}, indent=2))
    return 0 if ok else 1


def _decoder() -> Any:
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(WIDTH)
            self.attention = nn.MultiheadAttention(WIDTH, 4, batch_first=True)
            self.mlp = nn.Sequential(
                nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH)
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.norm(x)
            x = x + self.attention(h, h, h, need_weights=False, is_causal=False)[0]
            return x + self.mlp(x)

    import stratagem

    class Decoder(stratagem.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tokens = nn.Embedding(VOCAB, WIDTH)
            self.layers = nn.ModuleList(Block() for _ in range(DEPTH))
            self.head = nn.Linear(WIDTH, VOCAB)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.tokens is not None:
                x = self.tokens(x)
            for layer in self.layers:
                x = layer(x)
            return self.head(x) if self.head is not None else x

        def pipeline_loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    return Decoder


def _measure(schedule: str, steps: int, rounds: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, schedules

    import stratagem
    from stratagem_fsdp import PipelineStrategy

    decoder = _decoder()
    tokens = torch.randint(0, VOCAB, (BATCH, SEQUENCE), generator=torch.Generator().manual_seed(0))
    batch = (tokens, tokens.roll(-1, dims=1))

    strategy = stratagem.resolve(
        strategy=PipelineStrategy(pipeline_schedule=schedule, micro_batches=MICRO_BATCHES, log_loss_as=None),
        accelerator="cpu",
        devices=2,
    )
    strategy.setup_environment()
    torch.manual_seed(0)
    with strategy.module_init_context():
        module = decoder()
    strategy.setup_module(module)
    strategy.setup_optimizers([module.configure_optimizers()])

    rank = dist.get_rank()
    torch.manual_seed(0)
    whole = decoder()
    half = DEPTH // 2
    kept = nn.ModuleList(whole.layers[index] for index in range(rank * half, (rank + 1) * half))

    class HandStage(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tokens, self.layers, self.head = (
                (whole.tokens if rank == 0 else None),
                kept,
                (whole.head if rank else None),
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.tokens is not None:
                x = self.tokens(x)
            for layer in self.layers:
                x = layer(x)
            return self.head(x) if self.head is not None else x

    hand_module = HandStage()
    stage = PipelineStage(hand_module, rank, 2, torch.device("cpu"))
    hand_schedule = getattr(schedules, SCHEDULES[schedule])(
        stage, n_microbatches=MICRO_BATCHES, loss_fn=whole.pipeline_loss
    )
    hand_optimizer = torch.optim.AdamW(hand_module.parameters(), lr=1e-4)

    def strategy_step() -> None:
        strategy.run_training_steps(strategy.batch_to_device(batch), 0)

    def hand_step() -> None:
        losses: list[torch.Tensor] = []
        hand_schedule.step(batch[0], target=batch[1], losses=losses)
        hand_optimizer.step()
        hand_optimizer.zero_grad(set_to_none=True)
        loss = torch.stack(losses).mean() if losses else torch.zeros(())
        dist.broadcast(loss, src=1)

    def timed(step: Any) -> float:
        dist.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        dist.barrier()
        return steps / (time.perf_counter() - start)

    for _ in range(WARM_UP_STEPS):
        strategy_step()
        hand_step()
    measured: dict[str, list[float]] = {"strategy": [], "hand": [], "ratios": []}
    for round_ in range(rounds):
        order = [("strategy", strategy_step), ("hand", hand_step)]
        speeds = dict((name, timed(step)) for name, step in (order if round_ % 2 == 0 else order[::-1]))
        for name, speed in speeds.items():
            measured[name].append(speed)
        measured["ratios"].append(speeds["strategy"] / speeds["hand"])
    strategy.teardown()
    return measured
