"""model_parallel: steps/s of a GPT-style decoder against a hand-written parallelize_module + fully_shard loop.

    python tools/bench/run.py model_parallel [--layout dp_shard=1,tp=2] [--steps 10] [--rounds 5] [--json out.json]

Fresh CPU processes (gloo), as many as the layout's sizes multiply to, each build the same decoder (4
blocks of attention and MLP, width 256, 8 heads, sequences of 64 tokens, 8 per data-parallel rank):

- through ``ModelParallelStrategy(tp_plan=..., auto_wrap_policy={Block})`` with ``layout=``, driven as the
  Trainer drives it (``run_step`` / ``backward`` / ``optimizer_step`` / ``zero_grad``);
- by hand on the strategy's own mesh: ``parallelize_module`` per block over ``"tp"`` with the same plan,
  ``fully_shard`` per block and at the root over the data-parallel submesh, AdamW, ``loss.backward()``.

After a warm-up the two alternate rounds of ``--steps`` steps (who goes first alternates too); the ratio is
the median of the per-round ratios, printed beside the same ratio of rank 0's CPU time per step (far less
disturbed by other load). The whole pair runs twice, once with each model built first: the model built second
ran up to 10% slower in a process, with identical Python calls (the placement of its tensors), so the ratio
reported is the geometric mean of the two runs' ratios. Numbers taken while other jobs use the CPUs are noisy:
compare the ratios from one run, not absolute steps/s across runs. Target: model_parallel at least 0.97x the
hand loop.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any

from _ranks import run_ranks

VOCAB, WIDTH, HEADS, DEPTH, SEQUENCE, MICRO_BATCH = 512, 256, 8, 4, 64, 8
SPEED_TARGET = 0.97
PLAN = {
    "attention.q": "colwise",
    "attention.k": "colwise",
    "attention.v": "colwise",
    "attention.o": "rowwise",
    "mlp.up": "colwise",
    "mlp.down": "rowwise",
}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python tools/bench/run.py model_parallel", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--layout", default="dp_shard=1,tp=2", help="every size of the layout (default: tp=2 alone)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round (default: 10)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per contender (default: 5)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        return _worker(json.loads(args.worker))
    if args.steps < 1 or args.rounds < 1:
        parser.error(f"--steps={args.steps} and --rounds={args.rounds} must be at least 1.")
    from stratagem.mesh import parse_layout

    layout = parse_layout(args.layout)
    if -1 in layout.shape:
        parser.error(f"--layout={args.layout!r}: give every size (the world size is their product).")
    world_size = math.prod(layout.shape)
    # Which model is built first changes its steps/s by several percent (where its tensors land in memory), so
    # the pair runs twice, once with each built first, and the ratio is the geometric mean of the two runs'.
    runs = {
        order: run_ranks(
            "model_parallel",
            {"layout": args.layout, "steps": args.steps, "rounds": args.rounds, "raw_first": order == "raw first"},
            world_size,
        )[0]
        for order in ("strategy first", "raw first")
    }
    ratio = math.sqrt(math.prod(speed["ratio"] for speed in runs.values()))
    cpu_ratio = math.sqrt(math.prod(speed["cpu_time_ratio"] for speed in runs.values()))
    ok = ratio >= SPEED_TARGET
    print(
        f"layout {args.layout} on {world_size} processes ({os.cpu_count()} CPUs, load average "
        f"{', '.join(f'{value:.1f}' for value in os.getloadavg())}): model_parallel / hand-written {ratio:.3f} "
        f"(target >= {SPEED_TARGET}) {'OK' if ok else 'MISSED'}, CPU-time ratio {cpu_ratio:.3f} (rank 0)"
    )
    for order, speed in runs.items():
        print(
            f"  {order}: model_parallel {speed['strategy_steps_per_s']:.2f} steps/s, hand-written "
            f"{speed['raw_steps_per_s']:.2f}, ratio {speed['ratio']:.3f}, "
            f"CPU-time ratio {speed['cpu_time_ratio']:.3f}; "
            f"per-round ratios {', '.join(f'{value:.3f}' for value in speed['round_ratios'])}"
        )
    if args.json is not None:
        args.json.write_text(
            json.dumps({"layout": args.layout, "ratio": ratio, "cpu_time_ratio": cpu_ratio, "runs": runs}, indent=2)
        )
    return 0 if ok else 1


def _decoder() -> Any:
    import torch
    from torch import nn

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.num_heads, self.head_width = HEADS, WIDTH // HEADS
            self.q, self.k, self.v, self.o = (nn.Linear(WIDTH, WIDTH) for _ in range(4))

        def forward(self, x: Any) -> Any:
            batch, length, _ = x.shape
            q, k, v = (
                projection(x).view(batch, length, -1, self.head_width).transpose(1, 2)
                for projection in (self.q, self.k, self.v)
            )
            mixed = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.o(mixed.transpose(1, 2).reshape(batch, length, -1))

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up, self.down = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

        def forward(self, x: Any) -> Any:
            return self.down(nn.functional.gelu(self.up(x)))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm_1, self.norm_2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
            self.attention, self.mlp = Attention(), MLP()

        def forward(self, x: Any) -> Any:
            x = x + self.attention(self.norm_1(x))
            return x + self.mlp(self.norm_2(x))

    class Decoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding, self.position = nn.Embedding(VOCAB, WIDTH), nn.Embedding(SEQUENCE, WIDTH)
            self.blocks = nn.ModuleList(Block() for _ in range(DEPTH))
            self.norm, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB)

        def forward(self, tokens: Any) -> Any:
            h = self.embedding(tokens) + self.position(torch.arange(tokens.shape[1]))
            for block in self.blocks:
                h = block(h)
            return self.head(self.norm(h))

        def training_step(self, tokens: Any) -> Any:
            logits = self(tokens[:, :-1])
            return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))

    return Decoder, Block


def _worker(spec: dict[str, Any]) -> int:
    import torch
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    import stratagem
    from stratagem_fsdp import ModelParallelStrategy
    from stratagem_fsdp.tp_plan import STYLES

    decoder, block = _decoder()
    tp_plan = {f"blocks.*.{name}": style for name, style in PLAN.items()}
    strategy: Any = stratagem.resolve(
        strategy=ModelParallelStrategy(tp_plan=tp_plan, auto_wrap_policy={block}),
        layout=spec["layout"],
        accelerator="cpu",
        devices=int(os.environ["WORLD_SIZE"]),
    )
    strategy.setup_environment()
    mesh, layout = strategy.device_mesh, strategy.mesh_layout

    def build_strategy_model() -> Any:
        """The strategy's optimizer; the strategy keeps the module it set up."""
        torch.manual_seed(0)
        with strategy.module_init_context():
            module = decoder()
        strategy.setup_module(module)
        [optimizer] = strategy.setup_optimizers([torch.optim.AdamW(module.parameters(), lr=1e-4)])
        return optimizer

    def build_raw_model() -> tuple[Any, Any]:
        torch.manual_seed(0)
        raw = decoder()
        if int(layout.tp) > 1:
            for unit in raw.blocks:
                parallelize_module(unit, mesh["tp"], {name: STYLES[style]() for name, style in PLAN.items()})
        shard_mesh = mesh["dp_replicate", "dp_shard"] if int(layout.dp_replicate) > 1 else mesh["dp_shard"]
        for unit in raw.blocks:
            fully_shard(unit, mesh=shard_mesh)
        fully_shard(raw, mesh=shard_mesh, reshard_after_forward=False)
        raw_optimizer = torch.optim.AdamW(raw.parameters(), lr=1e-4)
        return raw, raw_optimizer

    if spec["raw_first"]:
        raw, raw_optimizer = build_raw_model()
        optimizer = build_strategy_model()
    else:
        optimizer = build_strategy_model()
        raw, raw_optimizer = build_raw_model()

    generator = torch.Generator().manual_seed(layout.data_parallel_rank(strategy.global_rank))
    batches = [torch.randint(0, VOCAB, (MICRO_BATCH, SEQUENCE + 1), generator=generator) for _ in range(4)]

    def strategy_step(batch: Any) -> None:
        loss = strategy.run_step("training_step", batch)
        strategy.backward(loss, optimizer)
        strategy.optimizer_step(optimizer)
        strategy.zero_grad(optimizer)

    def raw_step(batch: Any) -> None:
        raw.training_step(batch).backward()
        raw_optimizer.step()
        raw_optimizer.zero_grad(set_to_none=True)

    def timed(step: Any) -> tuple[float, float]:
        """Steps per second of wall-clock time, and per second of this process's CPU time."""
        strategy.barrier("benchmark round")
        start, cpu_start = time.perf_counter(), time.process_time()
        for index in range(spec["steps"]):
            step(batches[index % len(batches)])
        cpu = time.process_time() - cpu_start
        strategy.barrier("benchmark round")
        return spec["steps"] / (time.perf_counter() - start), spec["steps"] / cpu

    for batch in batches[:2]:
        strategy_step(batch)
        raw_step(batch)
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
    report = {
        "strategy_steps_per_s": statistics.median(rate for rate, _ in strategy_rates),
        "raw_steps_per_s": statistics.median(rate for rate, _ in raw_rates),
        "ratio": statistics.median(ratios),
        "cpu_time_ratio": statistics.median(cpu_ratios),
        "round_ratios": ratios,
    }
    Path(spec["out"]).write_text(json.dumps(report))
    strategy.teardown()
    return 0
