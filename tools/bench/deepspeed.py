"""DeepSpeed ZeRO: per-rank optimizer state, model-state bytes and peak RSS by stage, and steps/s against raw DeepSpeed.

    python tools/bench/run.py deepspeed [--variants 0,1,2,3,1o,2o,3o] [--steps 2] [--rounds 20] [--json out.json]

Every variant starts 2 fresh CPU processes (gloo) that build the same ~21M-parameter MLP with
AdamW through ``DeepSpeedStrategy`` and take a few optimizer steps, driven as the Trainer
drives it (``run_step`` / ``backward`` / ``optimizer_step``). Each rank then reports:

- optimizer-state elements: the elements of the Adam moments its optimizer holds;
- model-state bytes: the bytes of every distinct tensor storage it holds for parameters, fp32
  master weights and optimizer state (gradients, which exist only during a step, are left out);
- peak RSS of the process (``ru_maxrss``), with ``MALLOC_MMAP_THRESHOLD_=65536 MALLOC_ARENA_MAX=2``
  so that glibc returns freed memory; on CPU it hides much of ZeRO's saving (DeepSpeed keeps
  its own buffers), so the counts above are the numbers to compare.

Offload variants (``1o``, ``2o``, ``3o``) use DeepSpeedCPUAdam, as the strategy recommends.
Speed: in the stage-2 processes, the strategy and a hand-written loop over a second
``deepspeed.initialize`` engine (same config, model and data) alternate short rounds of
``--steps`` steps after a warm-up, so that changes in the machine's load fall on both alike; the
ratio is the strategy's total steps/s over the raw loop's. Numbers taken while other jobs use the
CPUs are noisy: compare ratios from one run, not absolute steps/s across runs.

Targets: optimizer state at stages 1-3 at most 0.55x stage 0 per rank; steps/s at least 0.95x raw.
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
_WORKER_ENV = {"DS_ACCELERATOR": "cpu", "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_ARENA_MAX": "2"}
"""DeepSpeed's CPU accelerator; glibc giving freed memory back at once, so peak RSS is what the ranks held."""
HIDDEN = 2048
LAYERS = 5
MICRO_BATCH = 8
OPTIMIZER_TARGET = 0.55
SPEED_TARGET = 0.95

VARIANTS: dict[str, dict[str, Any]] = {
    "0": {"stage": 0},
    "1": {"stage": 1},
    "2": {"stage": 2},
    "3": {"stage": 3},
    "1o": {"stage": 1, "offload_optimizer": True},
    "2o": {"stage": 2, "offload_optimizer": True},
    "3o": {"stage": 3, "offload_optimizer": True, "offload_parameters": True},
}
SPEED_VARIANT = "2"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python tools/bench/run.py deepspeed", description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per round (default: 2)")
    parser.add_argument("--rounds", type=int, default=20, help="timed rounds per contender (default: 20)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        return _worker(json.loads(args.worker))
    variants = [name.strip() for name in args.variants.split(",") if name.strip()]
    unknown = [name for name in variants if name not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}")
    results = {}
    for name in variants:
        spec = {"variant": name, "steps": args.steps, "rounds": args.rounds, "speed": name == SPEED_VARIANT}
        results[name] = {"ranks": run_ranks("deepspeed", spec, WORLD_SIZE, env=_WORKER_ENV, set_rank=True)}
        print(_row(name, results[name], results.get("0")), flush=True)
    report = _report(results)
    print(report["summary"])
    if args.json is not None:
        args.json.write_text(json.dumps({"results": results, **report}, indent=2))
    return 0 if report["ok"] else 1


# -- the calling process ------------------------------------------------------------------------


def _row(name: str, result: dict[str, Any], baseline: dict[str, Any] | None) -> str:
    rank = result["ranks"][0]
    ratio = ""
    if baseline is not None:
        ratio = (
            f"  optimizer state {rank['optimizer_elements'] / baseline['ranks'][0]['optimizer_elements']:.2f}x stage 0"
        )
    return (
        f"{_label(name):<28} optimizer-state elements/rank {rank['optimizer_elements']:>11,}  "
        f"model-state MiB/rank {rank['model_state_bytes'] / 2**20:8.1f}  peak RSS MiB/rank "
        f"{max(r['peak_rss_bytes'] for r in result['ranks']) / 2**20:7.0f}{ratio}"
    )


def _label(name: str) -> str:
    options = VARIANTS[name]
    label = f"stage {options['stage']}"
    if options.get("offload_parameters"):
        return label + " + offload opt+params"
    if options.get("offload_optimizer"):
        return label + " + offload optimizer"
    return label


def _report(results: dict[str, Any]) -> dict[str, Any]:
    lines, ok = [], True
    baseline = results.get("0")
    if baseline is not None:
        base = max(rank["optimizer_elements"] for rank in baseline["ranks"])
        for name, result in results.items():
            if name == "0":
                continue
            ratio = max(rank["optimizer_elements"] for rank in result["ranks"]) / base
            passed = ratio <= OPTIMIZER_TARGET
            ok &= passed
            lines.append(
                f"{_label(name)}: optimizer state per rank {ratio:.3f}x stage 0 (target <= {OPTIMIZER_TARGET}) "
                f"{'OK' if passed else 'MISSED'}"
            )
    speed = results.get(SPEED_VARIANT, {}).get("ranks", [{}])[0].get("speed")
    if speed is not None:
        passed = speed["ratio"] >= SPEED_TARGET
        ok &= passed
        lines.append(
            f"steps/s at stage {SPEED_VARIANT}: strategy {speed['strategy_steps_per_s']:.2f}, raw DeepSpeed "
            f"{speed['raw_steps_per_s']:.2f}, ratio {speed['ratio']:.3f} (target >= {SPEED_TARGET}) "
            f"{'OK' if passed else 'MISSED'}; median of per-round ratios {speed['median_round_ratio']:.3f}, "
            f"spread {min(speed['round_ratios']):.2f}-{max(speed['round_ratios']):.2f}"
        )
    return {"summary": "\n".join(lines), "ok": ok}


# -- in each rank -------------------------------------------------------------------------------


def _worker(spec: dict[str, Any]) -> int:
    import torch

    torch.manual_seed(0)
    strategy, model, optimizer = _strategy_run(VARIANTS[spec["variant"]])
    batches = _batches(strategy.global_rank)
    _train_with_strategy(strategy, optimizer, batches, 3)
    report: dict[str, Any] = {
        "rank": strategy.global_rank,
        "optimizer_elements": _optimizer_elements(strategy.engine),
        "model_state_bytes": _model_state_bytes(strategy.engine),
        "parameters": sum(parameter.ds_numel if hasattr(parameter, "ds_numel") else parameter.numel()
                          for parameter in model.parameters()),
    }  # fmt: skip
    if spec["speed"]:
        report["speed"] = _compare_speed(strategy, optimizer, batches, spec["steps"], spec["rounds"])
    report["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    Path(spec["out"]).write_text(json.dumps(report))
    # Ends the engine and the process group before the interpreter exits, as the Trainer does.
    strategy.teardown()
    return 0


def _model() -> Any:
    import torch
    from torch import nn

    class Mlp(nn.Module):
        """~21M parameters in ``LAYERS`` square linear layers; ``training_step`` is what the strategy calls."""

        def __init__(self) -> None:
            super().__init__()
            layers: list[nn.Module] = []
            for _ in range(LAYERS):
                layers += [nn.Linear(HIDDEN, HIDDEN), nn.GELU()]
            self.net = nn.Sequential(*layers)

        def forward(self, inputs: torch.Tensor) -> torch.Tensor:
            return self.net(inputs)

        def training_step(self, batch: Any) -> torch.Tensor:
            return _loss(self, batch)

    return Mlp()


def _loss(model: Any, batch: Any) -> Any:
    import torch

    inputs, targets = batch
    return torch.nn.functional.mse_loss(model(inputs).float(), targets)


def _strategy_run(options: dict[str, Any]) -> tuple[Any, Any, Any]:
    import stratagem
    from stratagem.strategies import LoopSettings
    from stratagem_deepspeed import DeepSpeedStrategy

    strategy = stratagem.resolve(strategy=DeepSpeedStrategy(**options), accelerator="cpu", devices=WORLD_SIZE)
    strategy.connect_loop_settings(LoopSettings())
    strategy.setup_environment()
    with strategy.module_init_context():
        model = _model()
    strategy.setup_module(model)
    [optimizer] = strategy.setup_optimizers([_optimizer(model.parameters(), options)])
    return strategy, model, optimizer


def _optimizer(parameters: Any, options: dict[str, Any]) -> Any:
    import torch

    if options.get("offload_optimizer"):
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(parameters, lr=1e-4, weight_decay=0.01, adamw_mode=True)
    return torch.optim.AdamW(parameters, lr=1e-4, weight_decay=0.01)


def _batches(rank: int, count: int = 4) -> list[Any]:
    import torch

    generator = torch.Generator().manual_seed(rank)
    return [
        (torch.randn(MICRO_BATCH, HIDDEN, generator=generator), torch.randn(MICRO_BATCH, HIDDEN, generator=generator))
        for _ in range(count)
    ]


def _train_with_strategy(strategy: Any, optimizer: Any, batches: list[Any], steps: int) -> None:
    for step in range(steps):
        batch = strategy.batch_to_device(batches[step % len(batches)])
        loss = strategy.run_step("training_step", batch)
        strategy.backward(loss, optimizer)
        strategy.optimizer_step(optimizer)
        strategy.zero_grad(optimizer)


def _train_raw(engine: Any, batches: list[Any], steps: int) -> None:
    for step in range(steps):
        inputs, targets = batches[step % len(batches)]
        loss = _loss(engine, (inputs, targets))
        engine.backward(loss)
        engine.step()


def _compare_speed(strategy: Any, optimizer: Any, batches: list[Any], steps: int, rounds: int) -> dict[str, Any]:
    import deepspeed
    import torch

    torch.manual_seed(0)
    raw_model = _model()
    raw_engine, _, _, _ = deepspeed.initialize(
        model=raw_model,
        optimizer=torch.optim.AdamW(raw_model.parameters(), lr=1e-4, weight_decay=0.01),
        config=strategy.config,
        dist_init_required=False,
    )
    _train_raw(raw_engine, batches, 3)
    contenders = {
        "strategy": lambda: _train_with_strategy(strategy, optimizer, batches, steps),
        "raw": lambda: _train_raw(raw_engine, batches, steps),
    }
    seconds: dict[str, list[float]] = {name: [] for name in contenders}
    for round_index in range(rounds):
        order = list(contenders) if round_index % 2 == 0 else list(reversed(contenders))
        for name in order:
            torch.distributed.barrier()
            start = time.perf_counter()
            contenders[name]()
            torch.distributed.barrier()
            seconds[name].append(time.perf_counter() - start)
    round_ratios = [raw / ours for ours, raw in zip(seconds["strategy"], seconds["raw"])]
    strategy_rate = steps * rounds / sum(seconds["strategy"])
    raw_rate = steps * rounds / sum(seconds["raw"])
    return {
        "strategy_steps_per_s": strategy_rate,
        "raw_steps_per_s": raw_rate,
        "round_ratios": round_ratios,
        "median_round_ratio": statistics.median(round_ratios),
        "ratio": strategy_rate / raw_rate,
    }


def _optimizer_elements(engine: Any) -> int:
    """Elements of the Adam moments held by this rank's optimizer (which, under ZeRO, steps a partition)."""
    import torch

    return sum(
        value.numel()
        for state in engine.basic_optimizer.state.values()
        for key, value in state.items()
        if key in ("exp_avg", "exp_avg_sq") and isinstance(value, torch.Tensor)
    )


def _model_state_bytes(engine: Any) -> int:
    """Bytes of the distinct storages behind parameters (or their ZeRO-3 partitions), the optimizer's
    fp32 master partitions and its state; views into one flat buffer count once."""
    import torch

    tensors = []
    for parameter in engine.module.parameters():
        tensors.append(parameter.data)
        if hasattr(parameter, "ds_tensor"):
            tensors.append(parameter.ds_tensor)
    optimizer = engine.basic_optimizer
    for group in optimizer.param_groups:
        tensors.extend(group["params"])
    for flat, state in optimizer.state.items():
        # Stage 3 hands its fp32 partitions to the optimizer only during a step; they key its state.
        tensors.append(flat)
        tensors.extend(value for value in state.values() if isinstance(value, torch.Tensor))
    storages = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())
