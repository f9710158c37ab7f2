"""Compiled modules under one strategy, as a user's script runs them (the launcher re-runs it for rank 1).

``python compile_script.py --strategy S --root DIR`` runs, on 2 CPU processes (1 for ``single_device``), with
the same seed and the same global batches:

1. ``compiled``: ``fit(torch.compile(module, backend=...))``, saving its last checkpoint;
2. ``blocks``: ``Trainer(compile={"backend": ..., "blocks": Block})`` fitting an uncompiled module for half the
   steps, then an uncompiled fit resuming from that checkpoint (compiled -> uncompiled), then one resuming from
   the uncompiled one's checkpoint (uncompiled -> compiled) with a module that compiles its blocks itself in
   ``configure_model``;
3. ``validate``: the compiled run's checkpoint validated by an uncompiled module, and ``--legacy`` (a
   checkpoint whose keys hold ``_orig_mod``, as compiled modules were saved before) too.

Rank 0 writes ``<root>/results.json``: each fit's per-step losses (mean over ranks), the graphs dynamo compiled
in each, the validation losses, the checkpoint paths.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch._dynamo.utils import counters
from torch.utils.data import DataLoader, TensorDataset

from stratagem import Module, Trainer
from stratagem.callbacks.callback import Callback
from stratagem.callbacks.model_checkpoint import ModelCheckpoint

FEATURES = 8
STEPS = 6
GLOBAL_BATCH = 8


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(FEATURES, FEATURES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.linear(x))


class Net(Module):
    """Two residual blocks and a head; counts its training steps to show the user's own methods still run."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(FEATURES, 1)
        self.steps_seen = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.steps_seen += 1
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def dataloader(world_size: int) -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(STEPS * GLOBAL_BATCH, FEATURES, generator=generator)
    y = x.sum(dim=1, keepdim=True).sin()
    return DataLoader(TensorDataset(x, y), batch_size=GLOBAL_BATCH // world_size)


class RecordLosses(Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer: Trainer, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        # The mean over ranks: each holds its share of the global batch.
        self.losses.append(float(trainer.strategy.reduce(_loss_of(outputs).detach(), op="mean")))


class CompilesBlocksItself(Net):
    """Compiles a submodule in ``configure_model``, as users do (``self.x = torch.compile(self.x)``)."""

    def __init__(self, backend: str) -> None:
        super().__init__()
        self.backend = backend

    def configure_model(self) -> None:
        self.blocks = torch.compile(self.blocks, backend=self.backend)


def graphs_compiled() -> int:
    """Graphs dynamo compiled since the last call (its caches emptied, so a graph is counted in each fit)."""
    count = int(counters["stats"]["unique_graphs"])
    torch._dynamo.reset()
    counters.clear()
    return count


def _loss_of(outputs: Any) -> torch.Tensor:
    return outputs["loss"] if isinstance(outputs, dict) else outputs


def fresh_module(backend: str | None = None) -> Net:
    torch.manual_seed(0)
    return Net() if backend is None else CompilesBlocksItself(backend)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--backend", default="eager")
    parser.add_argument("--legacy", type=Path, required=True, help="a checkpoint whose keys hold _orig_mod")
    args = parser.parse_args()
    devices = 1 if args.strategy == "single_device" else 2

    def trainer(name: str, max_steps: int, **options: Any) -> tuple[Trainer, RecordLosses]:
        recorder = RecordLosses()
        checkpoints = ModelCheckpoint(dirpath=args.root / name, save_last=True)
        made = Trainer(
            strategy=args.strategy,
            accelerator="cpu",
            devices=devices,
            max_steps=max_steps,
            num_sanity_val_steps=0,
            logger=False,
            enable_progress_bar=False,
            callbacks=[recorder, checkpoints],
            seed=0,
            **options,
        )
        return made, recorder

    results: dict[str, Any] = {}
    compiled_trainer, losses = trainer("compiled", STEPS)
    module = fresh_module()
    compiled_trainer.fit(torch.compile(module, backend=args.backend), dataloader(devices))
    results["compiled"] = losses.losses
    results["steps_seen"] = module.steps_seen
    results["graphs"] = {"compiled": graphs_compiled()}
    compiled_checkpoint = args.root / "compiled" / "last.ckpt"

    blocks = {"backend": args.backend, "blocks": Block}
    half, losses = trainer("blocks_half", STEPS // 2, compile=blocks)
    half.fit(fresh_module(), dataloader(devices))
    results["blocks_half"] = losses.losses
    results["graphs"]["blocks_half"] = graphs_compiled()
    uncompiled, losses = trainer("resumed_uncompiled", STEPS)
    uncompiled.fit(fresh_module(), dataloader(devices), ckpt_path=args.root / "blocks_half" / "last.ckpt")
    results["resumed_uncompiled"] = losses.losses
    recompiled, losses = trainer("resumed_compiled", STEPS + 2)
    recompiled.fit(
        fresh_module(args.backend),
        dataloader(devices),
        ckpt_path=args.root / "resumed_uncompiled" / "last.ckpt",
    )
    results["resumed_compiled"] = losses.losses
    results["graphs"]["resumed_compiled"] = graphs_compiled()

    validator, _ = trainer("validate", STEPS)
    [metrics] = validator.validate(fresh_module(), dataloader(devices), ckpt_path=compiled_checkpoint)
    results["validated_uncompiled"] = metrics["val_loss"]
    [metrics] = validator.validate(fresh_module(), dataloader(devices), ckpt_path=args.legacy)
    results["validated_legacy"] = metrics["val_loss"]
    results["checkpoints"] = {
        name: str(args.root / name / "last.ckpt")
        for name in ("compiled", "blocks_half", "resumed_uncompiled", "resumed_compiled")
    }
    if compiled_trainer.is_global_zero:
        (args.root / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
