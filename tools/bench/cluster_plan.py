"""Cluster plan: ``stratagem plan --world-size``'s per-rank estimate beside what real model_parallel ranks hold.

    python tools/bench/run.py cluster_plan --layouts tp=2,dp_shard=2xtp=2 [--dim 512 --layers 8 --seq-len 256]

For each layout, the planner plans the demo Llama decoder (``stratagem.demo.llama``, a config of the given size,
fp32, AdamW) for a world of that many CPU processes, one node; then the Trainer trains it for 3 steps on that many
gloo processes with ``ModelParallelStrategy`` in that layout, one ``fully_shard`` unit per block. Each rank counts
its local pieces of the parameters, of the gradients just before the optimizer steps, and of the optimizer's
state after it, and reads its peak RSS (``getrusage``) and its RSS before the model was built. The table gives the
planned and measured model state per rank, the planned device total (model state, activations and buffers) and
the measured peak above the process's own start, with the errors.

Not part of CI (a run takes a minute or two on 2 cores); packages/fsdp/tests/test_cluster_plan_measured.py checks
the model state of a tiny decoder on real ranks the same way.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import stratagem
import stratagem.callbacks

RUN_PY = Path(__file__).resolve().parent / "run.py"
BATCH = 2
STEPS = 3
GIB = 1024**3


def _layout(text: str) -> dict[str, int]:
    """``dp_shard=2xtp=2`` -> ``{"dp_shard": 2, "tp": 2}``."""
    layout = {}
    for part in text.split("x"):
        name, _, size = part.partition("=")
        layout[name.strip()] = int(size)
    return layout


def _config(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "size": "tiny",
        "dim": args.dim,
        "layers": args.layers,
        "heads": 8,
        "kv_heads": 4,
        "ffn_dim": 3 * args.dim,
        "vocab": args.vocab,
        "context": args.seq_len,
    }


def _current_rss() -> int:
    with open("/proc/self/statm") as stream:
        return int(stream.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _local_bytes(tensor: torch.Tensor) -> int:
    from torch.distributed.tensor import DTensor

    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.numel() * local.element_size()


class _Count(stratagem.callbacks.Callback):
    """Counts one rank's model state during the first step and writes it, with its RSS, at the end."""

    def __init__(self, out: Path, start_rss: int) -> None:
        self.out, self.start_rss = out, start_rss
        self.gradient_bytes = 0
        self.setup_peak_rss = 0

    def on_train_start(self, trainer: Any, module: Any) -> None:
        # The peak so far is the build's: the whole model each rank creates before its plan splits it, and setup.
        self.setup_peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

        def count_gradients(optimizer: torch.optim.Optimizer, *_: Any) -> None:
            grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
            self.gradient_bytes = max(self.gradient_bytes, sum(_local_bytes(grad) for grad in grads))

        for optimizer in trainer.optimizers:
            optimizer.register_step_pre_hook(count_gradients)

    def on_train_end(self, trainer: Any, module: Any) -> None:
        [optimizer] = trainer.optimizers
        state = [
            value for entry in optimizer.state.values() for value in entry.values() if isinstance(value, torch.Tensor)
        ]
        result = {
            "parameter_bytes": sum(_local_bytes(parameter) for parameter in module.parameters()),
            "gradient_bytes": self.gradient_bytes,
            # AdamW's step counters are 0-d tensors: not what the planner counts as state per element.
            "optimizer_state_bytes": sum(_local_bytes(value) for value in state if value.dim() > 0),
            "start_rss_bytes": self.start_rss,
            "setup_peak_rss_bytes": self.setup_peak_rss,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        }
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(result))


def _worker(args: argparse.Namespace) -> int:
    """Runs in every rank (the Trainer's launcher re-executes this command line)."""
    from stratagem.demo.llama import Block, LlamaModule
    from stratagem_fsdp import ModelParallelStrategy

    start = _current_rss()
    layout = _layout(args.layout)
    world = math.prod(layout.values())
    generator = torch.Generator().manual_seed(0)
    data = [(torch.randint(0, args.vocab, (BATCH, args.seq_len + 1), generator=generator),) for _ in range(STEPS)]
    trainer = stratagem.Trainer(
        accelerator="cpu",
        devices=world,
        strategy=ModelParallelStrategy(**layout, auto_wrap_policy={Block}),
        max_steps=STEPS,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        callbacks=[_Count(Path(args.out), start)],
    )
    trainer.fit(LlamaModule(**_config(args)), data)
    return 0


def _planned(args: argparse.Namespace, layout: dict[str, int]) -> Any:
    from stratagem import registry
    from stratagem.demo.llama import Block, LlamaModule
    from stratagem.planning.cluster import ClusterTarget, plan_cluster
    from stratagem.planning.devices import device_spec

    world = math.prod(layout.values())
    target = ClusterTarget(world, world, device_spec("h100-80gb"))
    strategies = {"model_parallel": registry.strategies.create("model_parallel", auto_wrap_policy={Block})}
    # The Trainer feeds (BATCH, seq_len + 1) token ids, of which the forward sees seq_len.
    plan = plan_cluster(LlamaModule(**_config(args)), strategies, target, batch_size=BATCH, seq_len=args.seq_len)
    full = {"pp": 1, "dp_replicate": 1, "dp_shard": 1, "tp": 1, **layout}
    return next(candidate for candidate in plan.candidates if candidate.layout == full), plan.workload


def check(args: argparse.Namespace, layout_text: str) -> dict[str, Any]:
    layout = _layout(layout_text)
    candidate, workload = _planned(args, layout)
    out = Path(tempfile.mkdtemp(prefix="stratagem_cluster_plan_"))
    argv = [sys.executable, str(RUN_PY), "cluster_plan", "--worker", "--layout", layout_text, "--out", str(out)]
    argv += ["--dim", str(args.dim), "--layers", str(args.layers), "--seq-len", str(args.seq_len)]
    argv += ["--vocab", str(args.vocab)]
    started = time.perf_counter()
    completed = subprocess.run(argv, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if completed.returncode != 0:
        sys.stderr.write(completed.stderr[-3000:])
        return {"layout": layout_text, "failed": completed.returncode}
    ranks = [json.loads(path.read_text()) for path in sorted(out.glob("rank*.json"))]
    memory = candidate.memory
    return {
        "layout": layout_text,
        "parameters": workload.footprint.parameters,
        "seconds": round(seconds, 1),
        "planned": {
            "parameter_bytes": memory.parameters,
            "gradient_bytes": memory.gradients,
            "optimizer_state_bytes": memory.optimizer_state,
            "activation_bytes": memory.activations,
            "buffer_bytes": memory.buffers,
            "device_bytes": memory.device,
        },
        "ranks": ranks,
    }


def _print(result: dict[str, Any]) -> None:
    if "failed" in result:
        print(f"{result['layout']:<18} failed (exit {result['failed']})")
        return
    planned = result["planned"]
    state = planned["parameter_bytes"] + planned["gradient_bytes"] + planned["optimizer_state_bytes"]
    for index, rank in enumerate(result["ranks"]):
        measured = rank["parameter_bytes"] + rank["gradient_bytes"] + rank["optimizer_state_bytes"]
        grown = rank["peak_rss_bytes"] - rank["start_rss_bytes"]
        print(
            f"{result['layout']:<18} rank {index}  {result['parameters'] / 1e6:6.1f}M  model state planned "
            f"{state / GIB:6.3f} GiB, measured {measured / GIB:6.3f} ({state / measured - 1:+.2%})  device total "
            f"planned {planned['device_bytes'] / GIB:6.3f} GiB (activations {planned['activation_bytes'] / GIB:.3f}, "
            f"buffers {planned['buffer_bytes'] / GIB:.3f}), peak RSS {rank['peak_rss_bytes'] / GIB:.3f} less "
            f"{rank['start_rss_bytes'] / GIB:.3f} at start = {grown / GIB:.3f} "
            f"({planned['device_bytes'] / grown - 1:+.0%}; {rank['setup_peak_rss_bytes'] / GIB:.3f} by the first "
            f"step)  {result['seconds']} s",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="run.py cluster_plan", description=__doc__.split("\n\n")[0])
    parser.add_argument("--layouts", default="tp=2,dp_shard=2xtp=2", help="comma-separated, e.g. dp_shard=2xtp=2")
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32_000)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--json", default=None, help="append every layout's result to this JSON-lines file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--layout", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return _worker(args)
    for layout_text in args.layouts.split(","):
        result = check(args, layout_text)
        _print(result)
        if args.json:
            with open(args.json, "a") as stream:
                stream.write(json.dumps(result) + "\n")
    return 0
