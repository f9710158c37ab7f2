"""``ipu_strategy``: a run on Graphcore IPUs through PopTorch's compiled executables.

Training goes through ``poptorch.trainingModel``: one call runs ``device_iterations`` optimizer steps,
each over ``replication_factor x accumulate_grad_batches`` micro-batches, with forward, backward and
the optimizer step compiled in; the Trainer only counts the steps (:class:`OwnsTrainingStep`).
Validation, test and prediction go through ``poptorch.inferenceModel`` (one per step method). One
host process drives every IPU, so collectives are identities. Data is rebuilt as
``poptorch.DataLoader`` (:class:`RebuildsDataLoaders`), whose batches are a call's combined batch.
The executors hold the weights on the device; the host copy is brought up to date before it is read
(checkpoints, ``module_full_state_dict``, the end of a run).
"""

from __future__ import annotations

import copy
import importlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.optim import LBFGS, Optimizer
from torch.utils.data import DataLoader, IterableDataset, RandomSampler, SequentialSampler

from stratagem import Module
from stratagem.checkpoint_io import PathLike
from stratagem.environments import ClusterEnvironment
from stratagem.launchers import InProcessLauncher, Launcher
from stratagem.precision import MixedPrecision
from stratagem.strategies import (
    EngineSteps,
    LoaderStage,
    LoopSettings,
    OwnsTrainingStep,
    RebuildsDataLoaders,
    SingleProcessCollectives,
    Strategy,
    StrategyOptions,
    TakesLoopSettings,
)
from stratagem_ipu.accelerator import POPTORCH_MISSING, poptorch_installed
from stratagem_ipu.precision import SUPPORTED, IPUMixedPrecision
from stratagem_ipu.step_module import StepModule, log_reduced

if TYPE_CHECKING:
    from typing_extensions import Unpack

_HOST = torch.device("cpu")


class IPUStrategy(SingleProcessCollectives, Strategy, OwnsTrainingStep, RebuildsDataLoaders, TakesLoopSettings):
    """Train and evaluate on IPUs with PopTorch.

    ``device_iterations``: optimizer steps per host call (default 1, or ``training_opts``'s).
    ``replication_factor``: model replicas, one IPU each (default: ``devices``).
    ``autoreport`` / ``autoreport_dir``: ask Poplar for its compilation and execution reports.
    ``training_opts`` / ``inference_opts``: your own ``poptorch.Options``; the values above and the
    Trainer's ``accumulate_grad_batches`` must agree with them.
    """

    max_optimizers = 1

    def __init__(
        self,
        device_iterations: int | None = None,
        replication_factor: int | None = None,
        autoreport: bool = False,
        autoreport_dir: str | Path | None = None,
        training_opts: Any = None,
        inference_opts: Any = None,
        **strategy_options: Unpack[StrategyOptions],
    ) -> None:
        super().__init__(**strategy_options)
        if not poptorch_installed():
            raise ModuleNotFoundError(f"ipu_strategy needs PopTorch. {POPTORCH_MISSING}.")
        self._poptorch = importlib.import_module("poptorch")
        _check_count("device_iterations", device_iterations)
        _check_count("replication_factor", replication_factor)
        if not isinstance(autoreport, bool):
            raise TypeError(f"autoreport={autoreport!r} is not valid; expected True or False.")
        if autoreport_dir is not None and not isinstance(autoreport_dir, str | Path):
            raise TypeError(f"autoreport_dir={autoreport_dir!r} is not valid; expected a path (str or Path) or None.")
        if autoreport_dir is not None and not autoreport:
            raise ValueError(
                f"autoreport_dir={str(autoreport_dir)!r} is given but autoreport=False; set autoreport=True."
            )
        for name, options in (("training_opts", training_opts), ("inference_opts", inference_opts)):
            if options is not None and not isinstance(options, self._poptorch.Options):
                raise TypeError(f"{name}={options!r} is not valid; expected a poptorch.Options or None.")
        self._device_iterations = _agreeing(
            "device_iterations", device_iterations, "training_opts.device_iterations", training_opts, 1
        )
        self._replication_factor = replication_factor
        self.autoreport = autoreport
        self.autoreport_dir = None if autoreport_dir is None else str(autoreport_dir)
        self._user_training_opts = training_opts
        self._user_inference_opts = inference_opts
        for name, options in (("training_opts", training_opts), ("inference_opts", inference_opts)):
            if options is not None and options.output_mode not in (
                self._poptorch.OutputMode.All,
                self._poptorch.OutputMode.Default,
            ):
                raise ValueError(
                    f"{name} sets outputMode({options.output_mode}); ipu_strategy needs OutputMode.All (every "
                    "micro-batch's loss and logged values, which it reduces for logging). Leave the output mode unset."
                )
        if inference_opts is not None and inference_opts.Training.gradient_accumulation != 1:
            raise ValueError("inference_opts sets Training.gradientAccumulation; inference takes no accumulation (1).")
        self._accumulate = 1
        self._launcher = InProcessLauncher()
        self._executors: dict[tuple[str, int | None], Any] = {}
        self._optimizer: Optimizer | None = None
        self._handed_over: list[dict[str, Any]] | None = None
        self._engine_options_before: str | None = None

    # -- wiring -----------------------------------------------------------------------------

    def configure_placement(
        self, *, devices: list[torch.device], num_nodes: int, cluster_environment: ClusterEnvironment
    ) -> None:
        if num_nodes != 1:
            raise ValueError(
                f"strategy='ipu_strategy' runs from one host process (num_nodes=1); got num_nodes={num_nodes}. "
                "Multi-host IPU runs (PopRun/PopDist) are not supported."
            )
        self._replication_factor = _agreeing(
            "replication_factor", self._replication_factor, "devices", None, len(devices), given_default=len(devices)
        )

    def complete_configuration(self) -> None:
        if self.accelerator.device_type != "ipu":
            raise ValueError(
                f"strategy='ipu_strategy' runs on accelerator='ipu', not {self.accelerator.device_type!r}."
            )
        for name, options in (
            ("training_opts", self._user_training_opts),
            ("inference_opts", self._user_inference_opts),
        ):
            if options is not None and options.replication_factor not in (1, self._replication_factor):
                raise ValueError(
                    f"{name}.replication_factor={options.replication_factor} contradicts the "
                    f"{self._replication_factor} replica(s) of replication_factor/devices; give one of them."
                )
        if self.precision.name not in SUPPORTED:
            raise ValueError(
                f"precision={self.precision.name!r} is not supported by ipu_strategy; use one of "
                f"{', '.join(SUPPORTED)}."
            )
        if isinstance(self.precision, MixedPrecision):
            self._precision = IPUMixedPrecision()

    def connect_loop_settings(self, settings: LoopSettings) -> None:
        if settings.gradient_clip_val is not None:
            raise ValueError(
                f"gradient_clip_val={settings.gradient_clip_val} cannot work with strategy='ipu_strategy': the "
                "optimizer step is compiled into the IPU executable with forward and backward, so the Trainer never "
                "holds the gradients to clip. Leave gradient_clip_val unset."
            )
        user = self._user_training_opts
        accumulate = settings.accumulate_grad_batches
        if user is not None and accumulate != 1 and user.Training.gradient_accumulation not in (1, accumulate):
            raise ValueError(
                f"accumulate_grad_batches={accumulate} contradicts training_opts' "
                f"Training.gradientAccumulation({user.Training.gradient_accumulation}); give one of them."
            )
        self._accumulate = settings.accumulate_grad_batches
        if user is not None and settings.accumulate_grad_batches == 1:
            self._accumulate = user.Training.gradient_accumulation
        super().connect_loop_settings(settings)

    @property
    def launcher(self) -> Launcher:
        return self._launcher

    @property
    def root_device(self) -> torch.device:
        # Weights and data stay on the host; PopTorch moves them to the IPUs.
        return _HOST

    @property
    def replication_factor(self) -> int:
        return self._replication_factor or 1

    @property
    def device_iterations(self) -> int:
        return self._device_iterations

    @property
    def optimizer_steps_per_call(self) -> int:
        return self._device_iterations

    # -- lifecycle --------------------------------------------------------------------------

    def setup_environment(self) -> None:
        super().setup_environment()
        if self.autoreport:
            report: dict[str, Any] = {"autoReport.all": "true"}
            if self.autoreport_dir is not None:
                Path(self.autoreport_dir).mkdir(parents=True, exist_ok=True)
                report["autoReport.directory"] = self.autoreport_dir
            self._engine_options_before = os.environ.get("POPLAR_ENGINE_OPTIONS")
            os.environ["POPLAR_ENGINE_OPTIONS"] = json.dumps(report)

    def setup_module(self, module: nn.Module) -> nn.Module:
        module = self.precision.convert_module(module)
        self._module = self._model = module
        self._executors = {}
        self._optimizer = None
        self._handed_over = None
        return module

    def setup_optimizers(self, optimizers: list[Optimizer]) -> list[Optimizer]:
        optimizers = super().setup_optimizers(optimizers)
        if not optimizers:
            raise ValueError(
                "ipu_strategy compiles the optimizer into the training executable: configure_optimizers "
                "must return one optimizer."
            )
        if isinstance(optimizers[0], LBFGS):
            raise ValueError(
                "ipu_strategy cannot train with LBFGS: its step re-evaluates the model in a closure, "
                "which a compiled step cannot do. Use another optimizer."
            )
        self._optimizer = optimizers[0]
        step = StepModule(
            self._user_module(),
            "training_step",
            self.precision.forward_context,
            mark_loss=lambda loss: self._poptorch.identity_loss(loss, reduction="none"),
        )
        self._executors[("training_step", None)] = self._poptorch.trainingModel(
            step, options=self._options(training=True), optimizer=self._optimizer
        )
        self._handed_over = _hyperparameters(self._optimizer)
        return optimizers

    # -- data -------------------------------------------------------------------------------

    def rebuild_dataloader(self, loader: Iterable[Any], stage: LoaderStage) -> Iterable[Any]:
        if isinstance(loader, self._poptorch.DataLoader):
            self._check_given_loader(loader, stage)
            return loader
        if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
            raise ValueError(
                "ipu_strategy feeds IPUs through poptorch.DataLoader, rebuilt from a torch DataLoader over a "
                f"map-style dataset; the {stage} data is {type(loader).__name__}. Pass a DataLoader, or a "
                "poptorch.DataLoader."
            )
        if loader.batch_size is None or type(loader.sampler) not in (RandomSampler, SequentialSampler):
            raise ValueError(
                f"The {stage} DataLoader uses a custom sampler or batch sampler ({type(loader.sampler).__name__}); "
                "ipu_strategy can only rebuild one with batch_size and shuffle. Pass a poptorch.DataLoader instead."
            )
        settings = {
            name: getattr(loader, name)
            for name in ("num_workers", "collate_fn", "worker_init_fn", "generator", "timeout")
            if getattr(loader, name, None) is not None
        }
        return self._poptorch.DataLoader(
            self._options(training=stage == "fit"),
            loader.dataset,
            batch_size=loader.batch_size,
            shuffle=isinstance(loader.sampler, RandomSampler),
            drop_last=True,
            **settings,
        )

    # -- steps ------------------------------------------------------------------------------

    def run_training_steps(self, batch: Any, batch_idx: int) -> EngineSteps:
        executor = self._executors[("training_step", None)]
        self._hand_over_optimizer(executor)
        self._attach(executor)
        micro_batches = self._device_iterations * self.replication_factor * self._accumulate
        loss, logged = executor(batch, _batch_index(batch_idx, micro_batches))
        # The optimizer stepped on the IPU, not on the host: without this mark torch's LR schedulers warn that
        # they step before the optimizer ever did.
        self._optimizer._opt_called = True  # type: ignore[union-attr]
        self._log(executor, logged, micro_batches)
        return EngineSteps(output=loss.float().mean(), optimizer_steps=self._device_iterations)

    def run_step(self, step_name: str, *args: Any) -> Any:
        if step_name == "training_step":
            raise RuntimeError("ipu_strategy runs training steps through run_training_steps (its compiled engine).")
        batch, batch_idx, *extra = args
        key = (step_name, extra[0] if extra else None)
        executor = self._executors.get(key)
        if executor is None:
            step = StepModule(self._user_module(), step_name, self.precision.forward_context, extra_args=tuple(extra))
            executor = self._poptorch.inferenceModel(step, options=self._options(training=False))
            self._executors[key] = executor
        self._attach(executor)
        micro_batches = self._device_iterations * self.replication_factor
        output, logged = executor(batch, _batch_index(batch_idx, micro_batches))
        self._log(executor, logged, micro_batches)
        return output

    def backward(self, loss: torch.Tensor, optimizer: Optimizer | None) -> None:
        raise RuntimeError("ipu_strategy runs backward inside its compiled training step.")

    def optimizer_step(self, optimizer: Optimizer) -> Any:
        raise RuntimeError("ipu_strategy steps the optimizer inside its compiled training step.")

    def clip_gradients(self, optimizer: Optimizer, clip_val: float, algorithm: Any = "norm") -> torch.Tensor | None:
        raise RuntimeError("ipu_strategy cannot clip gradients: they never leave the IPU.")

    # -- weights on the host ----------------------------------------------------------------

    def save_checkpoint(self, path: PathLike, state: dict[str, Any]) -> None:
        self._weights_to_host()
        super().save_checkpoint(path, state)

    def load_checkpoint(
        self, path: PathLike, state: dict[str, Any], strict: bool = True, weights_only: bool = True
    ) -> dict[str, Any]:
        remaining = super().load_checkpoint(path, state, strict=strict, weights_only=weights_only)
        for executor in self._executors.values():
            if executor.isAttachedToDevice():
                executor.copyWeightsToDevice()
        return remaining

    def module_full_state_dict(self) -> dict[str, Any]:
        self._weights_to_host()
        return super().module_full_state_dict()

    def teardown(self) -> None:
        try:
            for executor in self._executors.values():
                # Detaching copies the weights (and optimizer state) to the host first.
                executor.destroy()
            self._executors = {}
        finally:
            if self.autoreport:
                _restore_variable("POPLAR_ENGINE_OPTIONS", self._engine_options_before)
            super().teardown()

    def __repr__(self) -> str:
        return f"IPUStrategy(device_iterations={self._device_iterations}, replication_factor={self.replication_factor})"

    # -- helpers ----------------------------------------------------------------------------

    def _user_module(self) -> Module:
        module = self.module
        if not isinstance(module, Module):
            raise TypeError(f"ipu_strategy runs a stratagem.Module's step methods; got {type(module).__name__}.")
        return module

    def _options(self, training: bool) -> Any:
        user = self._user_training_opts if training else self._user_inference_opts
        options = copy.deepcopy(user) if user is not None else self._poptorch.Options()
        options.deviceIterations(self._device_iterations)
        options.replicationFactor(self.replication_factor)
        options.Training.gradientAccumulation(self._accumulate if training else 1)
        options.outputMode(self._poptorch.OutputMode.All)
        return options

    def _check_given_loader(self, loader: Any, stage: LoaderStage) -> None:
        """A user's own poptorch.DataLoader must combine as many micro-batches as the executor consumes."""
        given = loader.options
        expected = self._options(training=stage == "fit")
        for name in ("device_iterations", "replication_factor"):
            if getattr(given, name) != getattr(expected, name):
                raise ValueError(
                    f"The {stage} poptorch.DataLoader was built with {name}={getattr(given, name)}, but ipu_strategy "
                    f"runs with {name}={getattr(expected, name)}; build it with the strategy's options, or let the "
                    "strategy build it from a torch DataLoader."
                )
        if given.Training.gradient_accumulation != expected.Training.gradient_accumulation:
            raise ValueError(
                f"The {stage} poptorch.DataLoader was built with gradient accumulation "
                f"{given.Training.gradient_accumulation}, but ipu_strategy accumulates "
                f"{expected.Training.gradient_accumulation} (accumulate_grad_batches) for this stage; build it with "
                "the strategy's options, or let the strategy build it from a torch DataLoader."
            )

    def _attach(self, executor: Any) -> None:
        """Only the executor about to run holds IPUs: the others are detached (their weights reach the host)."""
        for other in self._executors.values():
            if other is not executor and other.isAttachedToDevice():
                other.detachFromDevice()
        if executor.isCompiled() and not executor.isAttachedToDevice():
            executor.attachToDevice()

    def _hand_over_optimizer(self, executor: Any) -> None:
        """A scheduler changed the host optimizer's hyperparameters: the compiled step takes the new ones."""
        assert self._optimizer is not None
        current = _hyperparameters(self._optimizer)
        if current != self._handed_over:
            executor.setOptimizer(self._optimizer)
            self._handed_over = current

    def _weights_to_host(self) -> None:
        for (step_name, _), executor in self._executors.items():
            if step_name == "training_step" and executor.isAttachedToDevice():
                executor.copyWeightsToHost()

    def _log(self, executor: Any, logged: tuple[torch.Tensor, ...], micro_batches: int) -> None:
        names = executor.model.logged
        if names:
            log_reduced(self._user_module(), names, logged, micro_batches)


def _batch_index(batch_idx: int, micro_batches: int) -> torch.Tensor:
    # An input, not a constant: the executable is traced once and reused for every batch.
    return torch.full((micro_batches,), batch_idx, dtype=torch.int64)


def _hyperparameters(optimizer: Optimizer) -> list[dict[str, Any]]:
    return [{key: value for key, value in group.items() if key != "params"} for group in optimizer.param_groups]


def _check_count(name: str, value: Any) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"{name}={value!r} is not valid; expected a positive int or None.")


def _agreeing(
    name: str, value: int | None, other_name: str, options: Any, default: int, given_default: int | None = None
) -> int:
    """``value``, or what ``options`` (or the default) says; a contradiction between them names both."""
    other = options.device_iterations if options is not None else given_default
    if value is not None and other is not None and value != other:
        raise ValueError(f"{name}={value} contradicts {other_name}={other}; give one of them.")
    if value is not None:
        return value
    return other if other is not None else default


def _restore_variable(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
