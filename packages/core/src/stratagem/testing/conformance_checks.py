"""The checks of the strategy conformance kit, run inside one process per strategy.

Run as ``python -m stratagem.testing.conformance_checks --strategy NAME --devices N --out DIR``:
a fresh command line, so a strategy whose launcher re-runs the command starts its ranks the
same way it would for a user's script. Every rank runs the same sequence; global rank zero
writes ``DIR/report.json`` mapping each check to ``{"ok": bool, "skipped": bool, "detail": str}``.

Each rank seeds torch differently (``SEED + rank``) just before it builds the module, so ranks
start from the same weights only if the strategy makes them (a broadcast from rank 0, or an
initialisation that does not depend on the rank's random state). Rank 0's seed is the one a
``single_device`` run uses, so its weights are the reference for every comparison.
"""

from __future__ import annotations

import argparse
import json
import math
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional
from torch.utils.data import DataLoader, TensorDataset

from stratagem import registry
from stratagem.callbacks import Callback
from stratagem.module import Module
from stratagem.runtime import Runtime
from stratagem.strategies import OwnsAccumulation, OwnsTrainingStep, RebuildsDataLoaders, Strategy
from stratagem.testing.own_loop_checks import own_loop
from stratagem.trainer import Trainer

FEATURES = 8
BATCH_PER_RANK = 8
SEED = 1234
DEFAULT_STEPS = 8
DEFAULT_RESUME_STEPS = (3, 5)
DEFAULT_BLOCKS = 3
REDUCED_PRECISION_REL_TOL = 2e-2
"""How far a precision that is not exact (``Precision.exact = False``) may stray from fp32, relative to
the largest value compared: bf16 keeps about 3 significant digits."""


TRAINER_STEP_METHODS = ("backward", "optimizer_step", "zero_grad", "clip_gradients")
"""What the Trainer must never call on a strategy whose engine owns the training step."""


class CheckSkipped(Exception):
    """A comparison that cannot be made for this strategy or these settings; the message says why."""


class ConformanceModule(Module):
    """A small regression model whose result depends only on the data and on rank 0's seed.

    Its layers are a list of blocks that ``forward`` runs in turn, and its loss is also ``pipeline_loss``: a
    pipeline strategy can cut it into stages (each holding some of the blocks) and compute the loss on the last.
    ``blocks`` is as :func:`build_net` takes it.
    """

    def __init__(self, blocks: int = DEFAULT_BLOCKS) -> None:
        super().__init__()
        self.blocks = blocks
        self.net: nn.ModuleList | None = None

    def configure_model(self) -> None:
        if self.net is None:
            # Different on every rank: only the strategy can make the ranks' weights agree.
            torch.manual_seed(SEED + self.global_rank)
            self.net = build_net(self.blocks)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        assert self.net is not None
        # A loop, not net(features): a pipeline stage holds only some of the blocks.
        for block in self.net:
            features = block(features)
        return features

    def pipeline_loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return functional.mse_loss(output, targets)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        features, targets = batch
        loss = self.pipeline_loss(self(features), targets)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        features, targets = batch
        self.log("val_loss", functional.mse_loss(self(features), targets), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def build_net(blocks: int = DEFAULT_BLOCKS) -> nn.ModuleList:
    """The blocks of :class:`ConformanceModule`, drawn from torch's current random state.

    Named ``net.0`` (Linear), ``net.1`` (Tanh) and ``net.2`` (Linear), as a ``Sequential`` would name them. More
    ``blocks`` put square Linears between the Tanh and the last Linear, for a pipeline cut into more stages.
    """
    if isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < DEFAULT_BLOCKS:
        raise ValueError(f"blocks={blocks!r} is not valid; expected an int of at least {DEFAULT_BLOCKS}.")
    hidden = [nn.Linear(16, 16) for _ in range(blocks - DEFAULT_BLOCKS)]
    return nn.ModuleList([nn.Linear(FEATURES, 16), nn.Tanh(), *hidden, nn.Linear(16, 1)])


def probe_collectives(strategy: Strategy) -> None:
    """Raise unless the strategy's collectives give the documented results on this rank."""
    world, rank = strategy.world_size, strategy.global_rank
    value = torch.tensor([float(rank + 1)], device=strategy.root_device)
    expected = {"sum": world * (world + 1) / 2, "mean": (world + 1) / 2, "max": float(world), "min": 1.0}
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


def observe_ranks(strategy: Strategy) -> dict[str, Any]:
    """What the ranks hold now: rank 0's whole weights, and how far each rank strays from rank 0.

    ``whole_differences`` compares each rank's :meth:`Strategy.module_full_state_dict` (where the rank
    gets one); ``replica_differences`` compares the tensors a rank holds whole (plain tensors of the
    parameter's full shape), which a strategy that replicates weights keeps equal on every rank.
    Shards are not compared. Call on every rank (it runs collectives).
    """
    whole = {key: value.detach().cpu().float().clone() for key, value in strategy.module_full_state_dict().items()}
    replicas = _replicated_tensors(strategy.module)
    rank_zero_whole = strategy.broadcast(whole if strategy.is_global_zero else None)
    rank_zero_replicas = strategy.broadcast(replicas if strategy.is_global_zero else None)
    shapes = {key: value.shape for key, value in rank_zero_whole.items()}
    own_replicas = {key: value for key, value in replicas.items() if shapes.get(key) == value.shape}
    zero_replicas = {key: value for key, value in rank_zero_replicas.items() if shapes.get(key) == value.shape}
    worst = torch.tensor(
        [
            _largest_difference(whole, rank_zero_whole, common_only=True) if whole else 0.0,
            _largest_difference(own_replicas, zero_replicas, common_only=True),
            float(len(own_replicas)),
        ],
        dtype=torch.float64,
    )
    per_rank = strategy.all_gather(worst.to(strategy.root_device)).cpu().tolist()
    return {
        "whole": rank_zero_whole,
        "whole_differences": [row[0] for row in per_rank],
        "replica_differences": [row[1] for row in per_rank],
        "replicas_compared": [int(row[2]) for row in per_rank],
    }


def raise_unless_ranks_agree(observed: dict[str, Any] | None, moment: str) -> str:
    if observed is None:
        raise AssertionError(f"{moment}, nothing was observed: the run did not reach that point")
    if any(value != 0.0 for value in observed["whole_differences"] + observed["replica_differences"]):
        raise AssertionError(
            f"{moment}, the ranks' weights differ from rank 0's: the whole weights (module_full_state_dict) by "
            f"{observed['whole_differences']} and the replicated tensors by {observed['replica_differences']} "
            "(one value per rank). Every rank must hold the same weights (a replica of rank 0's, or its shard)."
        )
    compared = observed["replicas_compared"]
    return f"{moment}, every rank agrees with rank 0 (replicated tensors compared per rank: {compared})"


class ObserveRun(Callback):
    """Records how ranks agree after setup and after the last step, and saves checkpoints at chosen steps.

    What it recorded is its state, so it also comes back from a run in spawned processes.
    """

    def __init__(self, directory: Path | None = None, save_steps: Sequence[int] = ()) -> None:
        self.directory = directory
        self.save_steps = set(save_steps)
        self.saved_at: int | None = None
        self.records: dict[str, Any] = {"setup": None, "end": None, "at_step": {}}

    def on_train_start(self, trainer: Trainer, module: Module) -> None:
        probe_collectives(trainer.strategy)
        self.records["setup"] = observe_ranks(trainer.strategy)

    def on_train_batch_end(self, trainer: Trainer, module: Module, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if self.directory is None or step not in self.save_steps or step == self.saved_at:
            return
        self.saved_at = step
        trainer.save_checkpoint(checkpoint_path(self.directory, step))
        self.records["at_step"][step] = observe_ranks(trainer.strategy)["whole"]

    def on_train_end(self, trainer: Trainer, module: Module) -> None:
        self.records["end"] = observe_ranks(trainer.strategy)

    def state_dict(self) -> dict[str, Any]:
        return {"records": self.records}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.records = state["records"]


def checkpoint_path(directory: Path, step: int) -> Path:
    return directory / f"step={step}.ckpt"


def make_data(world_size: int, steps: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(7)
    features = torch.randn(BATCH_PER_RANK * world_size * steps, FEATURES, generator=generator)
    targets = features.sum(dim=1, keepdim=True).sin()
    return TensorDataset(features, targets)


def flat_weights(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().cpu().float().clone() for name, value in module.state_dict().items()}


class Settings:
    """What the conformance run was asked to check."""

    def __init__(
        self,
        strategy: str,
        devices: int,
        accelerator: str = "cpu",
        precision: str = "32-true",
        tolerance: float | None = 1e-5,
        strategy_options: dict[str, Any] | None = None,
        steps: int = DEFAULT_STEPS,
        resume_steps: Sequence[int] = DEFAULT_RESUME_STEPS,
        blocks: int = DEFAULT_BLOCKS,
    ) -> None:
        self.strategy = strategy
        self.devices = devices
        self.accelerator = accelerator
        self.precision = precision
        self.tolerance = tolerance
        self.strategy_options = dict(strategy_options or {})
        self.steps = steps
        self.resume_steps = tuple(resume_steps)
        self.blocks = blocks


def run_checks(settings: Settings, workdir: Path) -> dict[str, dict[str, Any]]:
    """Run every check; each rank runs the same sequence (a rank that skipped a run would leave the others waiting)."""
    report: dict[str, dict[str, Any]] = {}
    steps = settings.steps

    def check(name: str, body: Callable[[], str]) -> None:
        try:
            report[name] = {"ok": True, "skipped": False, "detail": body()}
        except CheckSkipped as skipped:
            report[name] = {"ok": True, "skipped": True, "detail": str(skipped)}
        except Exception:
            report[name] = {"ok": False, "skipped": False, "detail": traceback.format_exc()}

    def passed(*names: str) -> bool:
        return all(report.get(name, {}).get("ok") for name in names)

    def trainer(**options: Any) -> Trainer:
        chosen: str | Strategy = settings.strategy
        if settings.strategy_options:
            # A fresh instance per Trainer: a strategy keeps the state of the run it set up.
            chosen = registry.strategies.create(settings.strategy, **settings.strategy_options)
        arguments: dict[str, Any] = {
            "strategy": chosen,
            "accelerator": settings.accelerator,
            "devices": settings.devices,
            "precision": settings.precision,
            "max_steps": steps,
            "enable_progress_bar": False,
            "logger": False,
            "enable_checkpointing": False,
            "num_sanity_val_steps": 0,
            "seed": SEED,
        }
        arguments.update(options)
        return Trainer(**arguments)

    def loader(batch_size: int) -> DataLoader:
        return DataLoader(make_data(settings.devices, steps), batch_size=batch_size, shuffle=False)

    def loaded_into_single_device(path: Path) -> dict[str, torch.Tensor]:
        module = ConformanceModule(settings.blocks)
        _single_device().validate(module, loader(BATCH_PER_RANK), ckpt_path=path)
        return flat_weights(module)

    def single_device_fit(batch_size: int, **options: Any) -> dict[str, torch.Tensor]:
        module = ConformanceModule(settings.blocks)
        _single_device(precision=settings.precision, seed=SEED, **options).fit(module, loader(batch_size))
        return flat_weights(module)

    state: dict[str, Any] = {}
    fitted_dir, resumed_dir, accumulated_dir = workdir / "fit", workdir / "resumed", workdir / "accumulated"
    own_loop_dir = workdir / "own_loop"

    def resolves() -> str:
        resolved = trainer().strategy
        state["exact"] = bool(resolved.precision.exact)
        state["handles_accumulation"] = isinstance(resolved, OwnsAccumulation)
        state["owns_step"] = isinstance(resolved, OwnsTrainingStep)
        # The ranks that read different batches: fewer than the devices where some split a model (tensor parallel).
        sampling = resolved.distributed_sampler_kwargs
        state["data_ranks"] = settings.devices if sampling is None else sampling["num_replicas"]
        return (
            f"{type(resolved).__name__} with launcher {type(resolved.launcher).__name__}; precision "
            f"{resolved.precision.name!r} is {'exact' if state['exact'] else 'not exact (Precision.exact=False)'}"
        )

    def weights_tolerance(reference: dict[str, torch.Tensor]) -> float:
        """0 for exact precisions (bitwise); otherwise the reduced-precision tolerance scaled to the weights."""
        if state["exact"]:
            return 0.0
        return REDUCED_PRECISION_REL_TOL * max(value.abs().max().item() for value in reference.values())

    def fit_trains_and_returns_weights() -> str:
        observer = ObserveRun(fitted_dir, (*settings.resume_steps, steps))
        run = trainer(callbacks=[observer])
        run.fit(ConformanceModule(settings.blocks), loader(BATCH_PER_RANK))
        state["fit"], state["trainer"] = observer, run
        if run.global_step != steps:
            raise AssertionError(f"global_step is {run.global_step} after max_steps={steps}")
        loss = run.callback_metrics.get("train_loss")
        if loss is None or not torch.isfinite(torch.as_tensor(loss)).all():
            raise AssertionError(f"callback_metrics lacks a finite train_loss: {run.callback_metrics}")
        return f"global_step={run.global_step}, train_loss={float(loss):.5f}"

    def engine_runs_whole_training_steps() -> str:
        run = trainer()
        strategy = run.strategy
        if not isinstance(strategy, OwnsTrainingStep):
            raise CheckSkipped("the Trainer runs this strategy's steps (it does not subclass OwnsTrainingStep)")
        trainer_calls: list[str] = []
        engine_calls: list[int] = []
        for name in TRAINER_STEP_METHODS:
            setattr(strategy, name, _recording(getattr(strategy, name), name, trainer_calls))
        run_engine = strategy.run_training_steps

        def counted(batch: Any, batch_idx: int) -> Any:
            result = run_engine(batch, batch_idx)
            engine_calls.append(result.optimizer_steps)
            return result

        strategy.run_training_steps = counted  # type: ignore[method-assign]
        run.fit(ConformanceModule(settings.blocks), loader(BATCH_PER_RANK))
        if trainer_calls:
            raise AssertionError(
                f"the Trainer called {sorted(set(trainer_calls))} on a strategy whose engine owns the training step"
            )
        per_call = strategy.optimizer_steps_per_call
        if sum(engine_calls) != run.global_step or any(not 0 < made <= per_call for made in engine_calls):
            raise AssertionError(
                f"the engine's calls reported {engine_calls} optimizer steps (at most optimizer_steps_per_call="
                f"{per_call} each), but global_step is {run.global_step}"
            )
        if run.global_step != steps:
            raise AssertionError(f"global_step is {run.global_step} after max_steps={steps}")
        loss = run.callback_metrics.get("train_loss")
        if loss is None or not torch.isfinite(torch.as_tensor(loss)).all():
            raise AssertionError(f"train_loss logged inside the engine's step did not arrive: {run.callback_metrics}")
        return (
            f"{len(engine_calls)} engine calls made {run.global_step} optimizer steps; the Trainer called none of "
            f"{', '.join(TRAINER_STEP_METHODS)}; train_loss={float(loss):.5f}"
        )

    def ranks_agree_after_setup() -> str:
        observed = state["fit"].records["setup"]
        agreement = raise_unless_ranks_agree(observed, "After setup_module (ranks seeded differently)")
        reference = _built_on_single_device(settings.precision, settings.blocks)
        worst = _largest_difference(observed["whole"], reference)
        allowed = weights_tolerance(reference)
        if worst > allowed:
            raise AssertionError(
                f"After setup_module, rank 0's whole weights differ from the module rank 0 built (seed {SEED}) by "
                f"{worst:.3g} (allowed {allowed:g}): the strategy did not start from rank 0's weights."
            )
        return f"{agreement}; rank 0's weights are the module it built (difference {worst:.3g})"

    def ranks_agree_after_fit() -> str:
        return raise_unless_ranks_agree(state["fit"].records["end"], f"After the last of {steps} steps")

    def validate_reports_metrics() -> str:
        results = trainer().validate(
            ConformanceModule(settings.blocks), loader(BATCH_PER_RANK), ckpt_path=checkpoint_path(fitted_dir, steps)
        )
        if len(results) != 1 or not math.isfinite(results[0].get("val_loss", math.nan)):
            raise AssertionError(f"validate returned {results}")
        state["val_loss"] = results[0]["val_loss"]
        return f"val_loss={results[0]['val_loss']:.5f}"

    def checkpoint_loads_into_single_device() -> str:
        path = checkpoint_path(fitted_dir, steps)
        module = ConformanceModule(settings.blocks)
        results = _single_device().validate(module, loader(BATCH_PER_RANK), ckpt_path=path)
        state["fitted"] = flat_weights(module)
        # single_device validates in fp32; a strategy at reduced precision computed its loss with ~3 digits.
        rel_tol = 1e-5 if state["exact"] else REDUCED_PRECISION_REL_TOL
        if "val_loss" in state and not math.isclose(results[0]["val_loss"], state["val_loss"], rel_tol=rel_tol):
            raise AssertionError(
                f"val_loss under single_device {results[0]['val_loss']} differs from {settings.strategy!r}'s "
                f"{state['val_loss']} at precision={settings.precision!r} by more than rel_tol={rel_tol:g}"
            )
        return f"{path.name} loads into single_device; validation agrees (rel_tol={rel_tol:g})"

    def checkpoints_hold_the_whole_weights() -> str:
        lines = []
        for step, live in sorted(state["fit"].records["at_step"].items()):
            saved = loaded_into_single_device(checkpoint_path(fitted_dir, step))
            worst = _largest_difference(saved, live)
            allowed = weights_tolerance(live)
            if worst > allowed:
                raise AssertionError(
                    f"The checkpoint saved at step {step}, loaded into single_device, differs from the whole weights "
                    f"the strategy held then (module_full_state_dict on rank 0) by {worst:.3g} (allowed {allowed:g}): "
                    "a checkpoint must hold the global state, not one rank's."
                )
            lines.append(f"step {step}: {worst:.3g}")
        return "checkpoint vs live whole weights: " + ", ".join(lines)

    def matches_single_device() -> str:
        if settings.tolerance is None:
            raise CheckSkipped(
                "not compared with single_device: tolerance=None (the strategy changes numerics on purpose)"
            )
        reference = single_device_fit(BATCH_PER_RANK * state["data_ranks"], max_steps=steps)
        worst = _largest_difference(state["fitted"], reference)
        if worst > settings.tolerance:
            raise AssertionError(
                f"weights differ from single_device on the same global batch by {worst:.3g} "
                f"(tolerance {settings.tolerance:g})"
            )
        return f"largest difference {worst:.3g} (tolerance {settings.tolerance:g})"

    def resume_continues_exactly(step: int) -> Callable[[], str]:
        def body() -> str:
            directory = resumed_dir / f"from_{step}"
            observer = ObserveRun(directory, (steps,))
            trainer(callbacks=[observer]).fit(
                ConformanceModule(settings.blocks), loader(BATCH_PER_RANK), ckpt_path=checkpoint_path(fitted_dir, step)
            )
            worst = _largest_difference(state["fitted"], loaded_into_single_device(checkpoint_path(directory, steps)))
            if worst != 0.0:
                raise AssertionError(
                    f"resumed from the checkpoint of step {step}, the weights after {steps} steps differ from the "
                    f"uninterrupted run's by {worst}"
                )
            raise_unless_ranks_agree(observer.records["end"], f"After resuming from step {step}")
            return f"resumed at step {step}: bitwise identical after {steps} steps; ranks agree"

        return body

    def accumulation_matches_single_device() -> str:
        if settings.tolerance is None:
            raise CheckSkipped("not compared with single_device: tolerance=None")
        if steps % 2:
            raise CheckSkipped(f"steps={steps} is odd: its batches do not make whole windows of 2")
        windows = steps // 2
        observer = ObserveRun(accumulated_dir, (windows,))
        trainer(callbacks=[observer], accumulate_grad_batches=2, max_steps=windows).fit(
            ConformanceModule(settings.blocks), loader(BATCH_PER_RANK)
        )
        raise_unless_ranks_agree(observer.records["end"], "After accumulating 2 batches per step")
        accumulated = loaded_into_single_device(checkpoint_path(accumulated_dir, windows))
        reference = single_device_fit(2 * BATCH_PER_RANK * state["data_ranks"], max_steps=windows)
        state["accumulation_reference"] = reference
        worst = _largest_difference(accumulated, reference)
        if worst > settings.tolerance:
            raise AssertionError(
                f"with accumulate_grad_batches=2, the weights after {windows} steps differ from single_device's "
                f"with twice the global batch by {worst:.3g} (tolerance {settings.tolerance:g})"
            )
        who = "the strategy" if state["handles_accumulation"] else "the Trainer (no_backward_sync)"
        if state["owns_step"]:
            who = "the strategy's engine, which owns the whole step"
        return f"accumulated by {who}: largest difference {worst:.3g} (tolerance {settings.tolerance:g})"

    def own_runtime() -> Runtime:
        chosen: str | Strategy = settings.strategy
        if settings.strategy_options:
            chosen = registry.strategies.create(settings.strategy, **settings.strategy_options)
        try:
            return Runtime(
                strategy=chosen,
                accelerator=settings.accelerator,
                devices=settings.devices,
                precision=settings.precision,
            )
        except ValueError as refused:
            if isinstance(trainer().strategy, OwnsTrainingStep | RebuildsDataLoaders):
                raise CheckSkipped(f"Runtime refuses this strategy, as it must: {refused}") from None
            raise

    def own_loop_run(steps: int, accumulate: int = 1, **options: Any) -> dict[str, Any]:
        arguments = {"resume_from": None, "resume_step": 0, "save_to": None, "blocks": settings.blocks, **options}
        result: dict[str, Any] = own_runtime().launch(
            own_loop, make_data(settings.devices, settings.steps), BATCH_PER_RANK, steps, accumulate, **arguments
        )
        if result["steps"] != steps:
            raise AssertionError(f"the own loop made {result['steps']} optimizer steps of {steps}")
        return result

    def compared_with(reference: dict[str, torch.Tensor], own: dict[str, torch.Tensor], what: str) -> str:
        if settings.tolerance is None:
            return f"{what}: not compared (tolerance=None)"
        worst = _largest_difference(own, reference)
        if worst > settings.tolerance:
            raise AssertionError(f"{what}: the weights differ by {worst:.3g} (tolerance {settings.tolerance:g})")
        return f"{what}: largest difference {worst:.3g}"

    def own_loop_trains_as_the_trainer() -> str:
        path = own_loop_dir / "end.ckpt"
        result = own_loop_run(steps, save_to=str(path))
        agreement = raise_unless_ranks_agree(result["ranks"], f"After {steps} steps of an own loop")
        live = result["ranks"]["whole"]
        worst = _largest_difference(loaded_into_single_device(path), live)
        if worst > weights_tolerance(live):
            raise AssertionError(
                f"Runtime.save's checkpoint, loaded into single_device, differs from the whole weights the own loop "
                f"held by {worst:.3g}: a checkpoint must hold the global state, not one rank's."
            )
        return f"{compared_with(state['fitted'], live, 'own loop vs Trainer')}; {agreement}; its checkpoint is whole"

    def own_loop_resumes_from_a_trainer_checkpoint() -> str:
        if not settings.resume_steps:
            raise CheckSkipped("resume_steps is empty: the Trainer saved no checkpoint to resume from")
        step = settings.resume_steps[0]
        result = own_loop_run(steps, resume_from=str(checkpoint_path(fitted_dir, step)), resume_step=step)
        raise_unless_ranks_agree(result["ranks"], f"After resuming an own loop from the Trainer's step {step}")
        return compared_with(state["fitted"], result["ranks"]["whole"], f"own loop resumed from step {step}")

    def own_loop_accumulation_matches_single_device() -> str:
        if settings.tolerance is None:
            raise CheckSkipped("not compared with single_device: tolerance=None")
        if steps % 2:
            raise CheckSkipped(f"steps={steps} is odd: its batches do not make whole windows of 2")
        windows = steps // 2
        result = own_loop_run(windows, accumulate=2)
        raise_unless_ranks_agree(result["ranks"], "After an own loop accumulated 2 batches per step")
        if "accumulation_reference" not in state:
            global_batch = 2 * BATCH_PER_RANK * settings.devices
            state["accumulation_reference"] = single_device_fit(global_batch, max_steps=windows)
        return compared_with(state["accumulation_reference"], result["ranks"]["whole"], "accumulated in an own loop")

    check("resolves", resolves)
    if passed("resolves"):
        check("fit_trains_and_returns_weights", fit_trains_and_returns_weights)
    if passed("fit_trains_and_returns_weights"):
        check("engine_runs_whole_training_steps", engine_runs_whole_training_steps)
        check("ranks_agree_after_setup", ranks_agree_after_setup)
        check("ranks_agree_after_fit", ranks_agree_after_fit)
        check("validate_reports_metrics", validate_reports_metrics)
        check("checkpoint_loads_into_single_device", checkpoint_loads_into_single_device)
    if passed("checkpoint_loads_into_single_device"):
        check("checkpoints_hold_the_whole_weights", checkpoints_hold_the_whole_weights)
        check("matches_single_device", matches_single_device)
        for step in settings.resume_steps:
            check(resume_check_name(step), resume_continues_exactly(step))
        check("accumulation_matches_single_device", accumulation_matches_single_device)
        check("own_loop_trains_as_the_trainer", own_loop_trains_as_the_trainer)
        check("own_loop_resumes_from_a_trainer_checkpoint", own_loop_resumes_from_a_trainer_checkpoint)
        check("own_loop_accumulation_matches_single_device", own_loop_accumulation_matches_single_device)
    run = state.get("trainer")
    is_global_zero = run is None or bool(run.is_global_zero)
    report["_meta"] = {"ok": True, "skipped": False, "detail": json.dumps({"is_global_zero": is_global_zero})}
    return report


def check_names(resume_steps: Sequence[int]) -> tuple[str, ...]:
    """The checks a run with these resume steps reports, in the order they run."""
    return (
        "resolves",
        "fit_trains_and_returns_weights",
        "engine_runs_whole_training_steps",
        "ranks_agree_after_setup",
        "ranks_agree_after_fit",
        "validate_reports_metrics",
        "checkpoint_loads_into_single_device",
        "checkpoints_hold_the_whole_weights",
        "matches_single_device",
        *(resume_check_name(step) for step in resume_steps),
        "accumulation_matches_single_device",
        "own_loop_trains_as_the_trainer",
        "own_loop_resumes_from_a_trainer_checkpoint",
        "own_loop_accumulation_matches_single_device",
    )


def resume_check_name(step: int) -> str:
    return f"resume_from_step_{step}_continues_exactly"


def _built_on_single_device(precision: str, blocks: int) -> dict[str, torch.Tensor]:
    """The weights rank 0 builds, made the way single_device makes them at this precision."""
    strategy = _single_device(precision=precision).strategy
    module = ConformanceModule(blocks)
    with strategy.module_init_context(empty_init=None):
        module.configure_model()
    return flat_weights(strategy.setup_module(module))


def _recording(method: Callable[..., Any], name: str, calls: list[str]) -> Callable[..., Any]:
    def recorded(*args: Any, **kwargs: Any) -> Any:
        calls.append(name)
        return method(*args, **kwargs)

    return recorded


def _replicated_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """The module's plain tensors (not shards such as DTensors), on the CPU in fp32."""
    return {
        key: value.detach().cpu().float().clone()
        for key, value in module.state_dict().items()
        if type(value) is torch.Tensor and value.numel() > 0
    }


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


def _largest_difference(
    first: dict[str, torch.Tensor], second: dict[str, torch.Tensor], common_only: bool = False
) -> float:
    keys = first.keys() & second.keys() if common_only else first.keys()
    if not common_only and first.keys() != second.keys():
        raise AssertionError(f"different tensors: {sorted(first.keys() ^ second.keys())}")
    differences = [
        (first[name].float() - second[name].float()).abs().max().item()
        for name in keys
        if first[name].shape == second[name].shape and first[name].numel() > 0
    ]
    mismatched = [name for name in keys if first[name].shape != second[name].shape]
    if mismatched and not common_only:
        raise AssertionError(f"tensors of different shapes: {mismatched}")
    return max(differences, default=0.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stratagem.testing.conformance_checks")
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--strategy-options", default="{}", type=json.loads, help="JSON object of strategy options")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--tolerance", type=float, default=1e-5, help="negative: do not compare with single_device")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument(
        "--resume-steps",
        default=",".join(map(str, DEFAULT_RESUME_STEPS)),
        type=lambda text: tuple(int(step) for step in text.split(",") if step),
    )
    parser.add_argument("--blocks", type=int, default=DEFAULT_BLOCKS, help="blocks of the kit's module (build_net)")
    parser.add_argument("--out", required=True, type=Path, help="where global rank zero writes report.json")
    parser.add_argument("--workdir", type=Path, help="checkpoints, shared by every rank (default: OUT/run)")
    args = parser.parse_args(argv)
    settings = Settings(
        strategy=args.strategy,
        devices=args.devices,
        accelerator=args.accelerator,
        precision=args.precision,
        tolerance=None if args.tolerance < 0 else args.tolerance,
        strategy_options=args.strategy_options,
        steps=args.steps,
        resume_steps=args.resume_steps,
        blocks=args.blocks,
    )
    report = run_checks(settings, args.workdir or args.out / "run")
    if json.loads(report["_meta"]["detail"])["is_global_zero"]:
        args.out.mkdir(parents=True, exist_ok=True)
        temporary = args.out / ".report.json.tmp"
        temporary.write_text(json.dumps(report, indent=2))
        temporary.replace(args.out / "report.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
