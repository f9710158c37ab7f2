"""``trainingModel`` / ``inferenceModel``: executors with a device copy of the weights, attached or not."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.func import functional_call
from torch.utils._pytree import tree_flatten, tree_unflatten

from poptorch._options import Options, OutputMode, ReductionType

_POOL_VARIABLE = "POPTORCH_STANDIN_IPUS"
_lock = threading.Lock()
_ipus_in_use = 0
_marked = threading.local()


def _pool_size() -> int:
    return int(os.environ.get(_POOL_VARIABLE, "4"))


def ipuHardwareIsAvailable(num_ipus: int = 1) -> bool:
    return 0 < num_ipus <= _pool_size()


def ipuHardwareVersion() -> int:
    return 2


def identity_loss(x: torch.Tensor, reduction: str) -> torch.Tensor:
    """Marks ``x`` as the loss the training executor runs backward on (reduced: ``sum``, ``mean`` or ``none``)."""
    if reduction == "sum":
        x = x.sum()
    elif reduction == "mean":
        x = x.mean()
    elif reduction != "none":
        raise ValueError(f"identity_loss(reduction={reduction!r}): expected 'sum', 'mean' or 'none'")
    _marked.loss = x
    return x


def trainingModel(
    model: nn.Module, options: Options | None = None, optimizer: torch.optim.Optimizer | None = None
) -> PoplarExecutor:
    return PoplarExecutor(model, options or Options(), training=True, optimizer=optimizer)


def inferenceModel(model: nn.Module, options: Options | None = None) -> PoplarExecutor:
    options = options or Options()
    if options.Training.gradient_accumulation != 1:
        raise ValueError(
            "inferenceModel: Options.Training.gradientAccumulation must be 1 for inference, "
            f"got {options.Training.gradient_accumulation}"
        )
    return PoplarExecutor(model, options, training=False)


class PoplarExecutor:
    """One compiled model. ``__call__`` takes the combined batch and returns what the output mode asks for."""

    def __init__(
        self, model: nn.Module, options: Options, training: bool, optimizer: torch.optim.Optimizer | None = None
    ) -> None:
        if not isinstance(options, Options):
            raise TypeError(f"options must be poptorch.Options, got {type(options).__name__}")
        self.model = model
        self.options = options
        self.training = training
        self._user_optimizer = optimizer
        if training and optimizer is None:
            self._user_optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        self._executable: object | None = None
        self._attached = False
        self._destroyed = False
        self._device_state: dict[str, torch.Tensor] = {}
        self._device_optimizer: torch.optim.Optimizer | None = None
        self.calls = 0

    # -- state ------------------------------------------------------------------------------

    def isCompiled(self) -> bool:
        return self._executable is not None

    def isAttachedToDevice(self) -> bool:
        return self._attached

    def compile(self, *args: Any, **kwargs: Any) -> None:
        self._check_alive()
        if self._executable is None:
            self._executable = object()
            _write_auto_report(self)
            self.attachToDevice()

    def attachToDevice(self) -> None:
        global _ipus_in_use
        self._check_alive()
        if self._executable is None:
            raise RuntimeError("attachToDevice: the model has not been compiled yet")
        if self._attached:
            raise RuntimeError("attachToDevice: the model is already attached to a device")
        needed = self.options.replication_factor
        with _lock:
            if _ipus_in_use + needed > _pool_size():
                raise RuntimeError(
                    f"attachToDevice: needs {needed} IPU(s) but {_ipus_in_use} of {_pool_size()} are attached to "
                    "other models: detach them first (detachFromDevice)"
                )
            _ipus_in_use += needed
        self._attached = True
        self._upload()

    def detachFromDevice(self) -> None:
        global _ipus_in_use
        if not self._attached:
            raise RuntimeError("detachFromDevice: the model is not attached to a device")
        self.copyWeightsToHost()
        with _lock:
            _ipus_in_use -= self.options.replication_factor
        self._attached = False
        self._device_state = {}
        self._device_optimizer = None

    def copyWeightsToHost(self) -> None:
        self._check_attached("copyWeightsToHost")
        with torch.no_grad():
            for name, tensor in self._host_tensors().items():
                tensor.copy_(self._device_state[name])
        if self._device_optimizer is not None and self._user_optimizer is not None:
            # Only the state (momenta) comes back; the host's hyperparameters stay the host's.
            state = self._device_optimizer.state_dict()
            state["param_groups"] = self._user_optimizer.state_dict()["param_groups"]
            self._user_optimizer.load_state_dict(state)

    def copyWeightsToDevice(self) -> None:
        self._check_attached("copyWeightsToDevice")
        self._upload()

    def setOptimizer(self, optimizer: torch.optim.Optimizer) -> None:
        if not self.training:
            raise RuntimeError("setOptimizer: only a training model has an optimizer")
        self._user_optimizer = optimizer
        if self._device_optimizer is not None:
            for device_group, group in zip(self._device_optimizer.param_groups, optimizer.param_groups, strict=True):
                device_group.update({key: value for key, value in group.items() if key != "params"})

    def destroy(self) -> None:
        if self._attached:
            self.detachFromDevice()
        self._executable = None
        self._destroyed = True

    # -- running ----------------------------------------------------------------------------

    def __call__(self, *args: Any) -> Any:
        self._check_alive()
        if self._executable is None:
            self.compile(*args)
        self._check_attached("calling the model")
        self.calls += 1
        options = self.options
        per_step = options.replication_factor * (options.Training.gradient_accumulation if self.training else 1)
        micro_batches = _split(args, options.device_iterations * per_step)
        outputs: list[Any] = []
        for iteration in range(options.device_iterations):
            chunk = micro_batches[iteration * per_step : (iteration + 1) * per_step]
            outputs.extend(self._train_step(chunk) if self.training else self._infer(chunk))
        return _combine(outputs, self._output_mode())

    def _train_step(self, micro_batches: list[tuple[Any, ...]]) -> list[Any]:
        assert self._device_optimizer is not None
        mean = self.options.Training.accumulation_and_replication_reduction_type == ReductionType.Mean
        self._device_optimizer.zero_grad(set_to_none=True)
        outputs = []
        for micro_batch in micro_batches:
            _marked.loss = None
            output = functional_call(self.model, self._device_state, micro_batch)
            loss = _marked.loss
            _marked.loss = None
            if loss is None:
                raise RuntimeError(
                    "trainingModel: the model's forward marked no loss; wrap the loss in poptorch.identity_loss"
                )
            (loss / len(micro_batches) if mean else loss).backward()
            outputs.append(_detached(output))
        self._device_optimizer.step()
        return outputs

    def _infer(self, micro_batches: list[tuple[Any, ...]]) -> list[Any]:
        with torch.no_grad():
            return [_detached(functional_call(self.model, self._device_state, batch)) for batch in micro_batches]

    def _output_mode(self) -> OutputMode:
        mode = self.options.output_mode
        if mode == OutputMode.Default:
            return OutputMode.Final if self.training else OutputMode.All
        if mode == OutputMode.EveryN:
            raise NotImplementedError("the stand-in does not reproduce OutputMode.EveryN")
        return mode

    # -- weights ----------------------------------------------------------------------------

    def _host_tensors(self) -> dict[str, torch.Tensor]:
        tensors = dict(self.model.named_parameters())
        tensors.update(dict(self.model.named_buffers()))
        return tensors

    def _upload(self) -> None:
        self._device_state = {
            name: tensor.detach().clone().requires_grad_(tensor.requires_grad)
            for name, tensor in self._host_tensors().items()
        }
        if self.training:
            self._device_optimizer = self._make_device_optimizer()

    def _make_device_optimizer(self) -> torch.optim.Optimizer:
        host = self._user_optimizer
        assert host is not None
        by_identity = {id(tensor): name for name, tensor in self.model.named_parameters()}
        groups = []
        for group in host.param_groups:
            device_params = [self._device_state[by_identity[id(param)]] for param in group["params"]]
            groups.append({**{key: value for key, value in group.items() if key != "params"}, "params": device_params})
        device = type(host)(groups)
        device.load_state_dict(host.state_dict())
        return device

    def _check_alive(self) -> None:
        if self._destroyed:
            raise RuntimeError("the model was destroyed")

    def _check_attached(self, what: str) -> None:
        if not self._attached:
            raise RuntimeError(f"{what}: the model is detached from its device; call attachToDevice() first")


def _split(args: tuple[Any, ...], count: int) -> list[tuple[Any, ...]]:
    leaves, spec = tree_flatten(args)
    pieces: list[list[Any]] = [[] for _ in range(count)]
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            if leaf.dim() == 0 or leaf.shape[0] % count:
                raise ValueError(
                    f"an input of shape {tuple(leaf.shape)} does not divide into {count} micro-batches "
                    "(device_iterations x replication_factor x gradient_accumulation)"
                )
            for index, piece in enumerate(leaf.chunk(count)):
                pieces[index].append(piece)
        else:
            for piece in pieces:
                piece.append(leaf)
    return [tree_unflatten(piece, spec) for piece in pieces]


def _detached(output: Any) -> Any:
    leaves, spec = tree_flatten(output)
    return tree_unflatten([leaf.detach() if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves], spec)


def _combine(outputs: list[Any], mode: OutputMode) -> Any:
    if mode == OutputMode.Final:
        return outputs[-1]
    flat = [tree_flatten(output) for output in outputs]
    spec = flat[0][1]
    combined = []
    for position in range(len(flat[0][0])):
        values = [leaves[position] for leaves, _ in flat]
        first = values[0]
        if not isinstance(first, torch.Tensor):
            combined.append(first)
        elif mode == OutputMode.Sum:
            combined.append(torch.stack(values).sum(dim=0))
        elif first.dim() == 0:
            combined.append(torch.stack(values))
        else:
            combined.append(torch.cat(values))
    return tree_unflatten(combined, spec)


def _write_auto_report(executor: PoplarExecutor) -> None:
    """What Poplar's ``autoReport`` does at compile time, reduced to a note of what was compiled."""
    engine_options = json.loads(os.environ.get("POPLAR_ENGINE_OPTIONS", "{}"))
    if str(engine_options.get("autoReport.all", "false")).lower() != "true":
        return
    directory = Path(engine_options.get("autoReport.directory", "."))
    directory.mkdir(parents=True, exist_ok=True)
    kind = "training" if executor.training else "inference"
    (directory / f"{kind}_{id(executor)}.json").write_text(json.dumps(executor.options.toDict()))
