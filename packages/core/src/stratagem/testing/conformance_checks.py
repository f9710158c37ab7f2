"""The checks of the strategy conformance kit, run inside one process per strategy.

Run as ``python -m stratagem.testing.conformance_checks --strategy NAME --devices N --out DIR``:
a fresh command line, so a strategy whose launcher re-runs the command starts its ranks the
same way it would for a user's script. Every rank runs the same sequence; global rank zero
writes ``DIR/report.json`` mapping each check to ``{"ok": bool, "detail": str}``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional
from torch.utils.data import DataLoader, TensorDataset

from stratagem.callbacks import Callback, ModelCheckpoint
from stratagem.module import Module
from stratagem.trainer import Trainer

FEATURES = 8
BATCH_PER_RANK = 8
STEPS = 8
RESUME_AT = 4


class ConformanceModule(Module):
    """A small regression model whose result depends only on the data and the seed."""

    def __init__(self) -> None:
        super().__init__()
        self.net: nn.Module | None = None

    def configure_model(self) -> None:
        if self.net is None:
            self.net = nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        assert self.net is not None
        return self.net(features)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        features, targets = batch
        loss = functional.mse_loss(self(features), targets)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        features, targets = batch
        self.log("val_loss", functional.mse_loss(self(features), targets), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


class CollectivesProbe(Callback):
    """Fails the run unless the strategy's collectives give the documented results on every rank."""

    def on_train_start(self, trainer: Trainer, module: Module) -> None:
        strategy = trainer.strategy
        world, rank = strategy.world_size, strategy.global_rank
        value = torch.tensor([float(rank + 1)], device=strategy.root_device)
        expected = {
            "sum": world * (world + 1) / 2,
            "mean": (world + 1) / 2,
            "max": float(world),
            "min": 1.0,
        }
        for op, want in expected.items():
            got = strategy.reduce(value, op).item()  # type: ignore[arg-type]
            if not math.isclose(got, want, rel_tol=1e-6):
                raise AssertionError(f"reduce(op={op!r}) gave {got} on rank {rank}; expected {want}")
        gathered = strategy.all_gather(value)
        if gathered.shape[0] != world or sorted(gathered.flatten().tolist()) != [float(r + 1) for r in range(world)]:
            raise AssertionError(f"all_gather gave {gathered.tolist()} on rank {rank}")
        sent = strategy.broadcast({"from": rank, "tensor": [rank]}, src=0)
        if sent != {"from": 0, "tensor": [0]}:
            raise AssertionError(f"broadcast of an object gave {sent} on rank {rank}")
        strategy.barrier("conformance")
        if strategy.reduce_boolean(rank == 0, all_ranks=False) is not True:
            raise AssertionError("reduce_boolean(any) lost rank 0's True")


def make_data(world_size: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(7)
    features = torch.randn(BATCH_PER_RANK * world_size * STEPS, FEATURES, generator=generator)
    targets = features.sum(dim=1, keepdim=True).sin()
    return TensorDataset(features, targets)


def loader(world_size: int, batch_size: int) -> DataLoader:
    return DataLoader(make_data(world_size), batch_size=batch_size, shuffle=False)


def flat_weights(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().cpu().float() for name, value in module.state_dict().items()}


FULL_PRECISIONS = ("32-true", "32", "64-true", "64")
REDUCED_PRECISION_REL_TOL = 2e-2


def run_checks(
    strategy: str, devices: int, accelerator: str, precision: str, tolerance: float | None, workdir: Path
) -> dict[str, dict[str, Any]]:
    """Run every check; each rank runs the same sequence (a rank that skipped a run would leave the others waiting)."""
    report: dict[str, dict[str, Any]] = {}

    def check(name: str, body: Callable[[], str]) -> None:
        try:
            report[name] = {"ok": True, "detail": body()}
        except Exception:
            report[name] = {"ok": False, "detail": traceback.format_exc()}

    def trainer(**options: Any) -> Trainer:
        settings: dict[str, Any] = {
            "strategy": strategy,
            "accelerator": accelerator,
            "devices": devices,
            "precision": precision,
            "max_steps": STEPS,
            "enable_progress_bar": False,
            "logger": False,
            "enable_checkpointing": False,
            "num_sanity_val_steps": 0,
            "seed": 1234,
        }
        settings.update(options)
        return Trainer(**settings)

    def checkpointing(directory: str) -> dict[str, Any]:
        saver = ModelCheckpoint(dirpath=workdir / directory, every_n_train_steps=RESUME_AT, save_top_k=-1)
        return {"enable_checkpointing": True, "callbacks": [CollectivesProbe(), saver]}

    state: dict[str, Any] = {}

    def resolves() -> str:
        resolved = trainer().strategy
        state["world_size"] = devices
        return f"{type(resolved).__name__} with launcher {type(resolved.launcher).__name__}"

    def fit_trains_and_returns_weights() -> str:
        run = trainer(**checkpointing("fit"))
        run.fit(ConformanceModule(), loader(state["world_size"], BATCH_PER_RANK))
        state["trainer"] = run
        if run.global_step != STEPS:
            raise AssertionError(f"global_step is {run.global_step} after max_steps={STEPS}")
        loss = run.callback_metrics.get("train_loss")
        if loss is None or not torch.isfinite(torch.as_tensor(loss)).all():
            raise AssertionError(f"callback_metrics lacks a finite train_loss: {run.callback_metrics}")
        return f"global_step={run.global_step}, train_loss={float(loss):.5f}"

    def validate_reports_metrics() -> str:
        module = ConformanceModule()
        results = trainer().validate(
            module, loader(1, BATCH_PER_RANK), ckpt_path=_checkpoint_at(workdir / "fit", STEPS)
        )
        if len(results) != 1 or not math.isfinite(results[0].get("val_loss", math.nan)):
            raise AssertionError(f"validate returned {results}")
        state["val_loss"] = results[0]["val_loss"]
        return f"val_loss={results[0]['val_loss']:.5f}"

    def checkpoint_loads_into_single_device() -> str:
        path = _checkpoint_at(workdir / "fit", STEPS)
        module = ConformanceModule()
        results = _single_device().validate(module, loader(1, BATCH_PER_RANK), ckpt_path=path)
        state["fitted"] = flat_weights(module)
        # single_device validates in fp32; a strategy at reduced precision computed its loss with ~3 digits.
        rel_tol = 1e-5 if precision in FULL_PRECISIONS else REDUCED_PRECISION_REL_TOL
        if "val_loss" in state and not math.isclose(results[0]["val_loss"], state["val_loss"], rel_tol=rel_tol):
            raise AssertionError(
                f"val_loss under single_device {results[0]['val_loss']} differs from {strategy!r}'s "
                f"{state['val_loss']} at precision={precision!r} by more than rel_tol={rel_tol:g}"
            )
        return f"{path.name} loads into single_device; validation agrees (rel_tol={rel_tol:g})"

    def matches_single_device() -> str:
        module = ConformanceModule()
        _single_device(max_steps=STEPS, seed=1234).fit(
            module, loader(state["world_size"], BATCH_PER_RANK * state["world_size"])
        )
        if tolerance is None:
            return "not compared (tolerance=None)"
        worst = _largest_difference(state["fitted"], flat_weights(module))
        if worst > tolerance:
            raise AssertionError(f"weights differ from single_device on the same global batch by {worst:.3g}")
        return f"largest difference {worst:.3g} (tolerance {tolerance:g})"

    def resume_continues_exactly() -> str:
        trainer(**checkpointing("resumed")).fit(
            ConformanceModule(),
            loader(state["world_size"], BATCH_PER_RANK),
            ckpt_path=_checkpoint_at(workdir / "fit", RESUME_AT),
        )
        module = ConformanceModule()
        _single_device().validate(
            module, loader(1, BATCH_PER_RANK), ckpt_path=_checkpoint_at(workdir / "resumed", STEPS)
        )
        worst = _largest_difference(state["fitted"], flat_weights(module))
        if worst != 0.0:
            raise AssertionError(f"resumed from step {RESUME_AT}, weights differ from the uninterrupted run by {worst}")
        return f"resumed at step {RESUME_AT}: bitwise identical after {STEPS} steps"

    check("resolves", resolves)
    if report["resolves"]["ok"]:
        check("fit_trains_and_returns_weights", fit_trains_and_returns_weights)
    if report.get("fit_trains_and_returns_weights", {}).get("ok"):
        check("validate_reports_metrics", validate_reports_metrics)
        check("checkpoint_loads_into_single_device", checkpoint_loads_into_single_device)
    if report.get("checkpoint_loads_into_single_device", {}).get("ok"):
        check("matches_single_device", matches_single_device)
        check("resume_continues_exactly", resume_continues_exactly)
    run = state.get("trainer")
    report["_meta"] = {"ok": True, "detail": json.dumps({"is_global_zero": run is None or bool(run.is_global_zero)})}
    return report


def _single_device(**options: Any) -> Trainer:
    settings: dict[str, Any] = {
        "strategy": "single_device",
        "accelerator": "cpu",
        "devices": 1,
        "enable_progress_bar": False,
        "logger": False,
        "enable_checkpointing": False,
        "num_sanity_val_steps": 0,
    }
    settings.update(options)
    return Trainer(**settings)


def _largest_difference(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> float:
    if first.keys() != second.keys():
        raise AssertionError(f"different tensors: {sorted(first.keys() ^ second.keys())}")
    return max((first[name] - second[name]).abs().max().item() for name in first)


def _checkpoint_at(directory: Path, step: int) -> Path:
    matches = sorted(path for path in directory.glob(f"*step={step}*") if not path.name.startswith("."))
    if not matches:
        raise AssertionError(f"no checkpoint for step {step} in {directory}: {sorted(os.listdir(directory))}")
    return matches[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stratagem.testing.conformance_checks")
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--tolerance", type=float, default=1e-5, help="negative: do not compare with single_device")
    parser.add_argument("--out", required=True, type=Path, help="where global rank zero writes report.json")
    parser.add_argument("--workdir", type=Path, help="checkpoints, shared by every rank (default: OUT/run)")
    args = parser.parse_args(argv)
    tolerance = None if args.tolerance < 0 else args.tolerance
    workdir = args.workdir or args.out / "run"
    report = run_checks(args.strategy, args.devices, args.accelerator, args.precision, tolerance, workdir)
    if json.loads(report["_meta"]["detail"])["is_global_zero"]:
        args.out.mkdir(parents=True, exist_ok=True)
        temporary = args.out / ".report.json.tmp"
        temporary.write_text(json.dumps(report, indent=2))
        temporary.replace(args.out / "report.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
