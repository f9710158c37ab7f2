"""step_calls: the per-step strategy calls a fit binds once do what the strategy's methods do."""

from typing import Any

import torch
from torch import nn

import stratagem
from stratagem.precision import Precision
from stratagem.strategies import SingleDeviceStrategy
from stratagem.strategies._batch import device_mover
from stratagem.strategies.step_calls import step_calls


class _Stepping(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(3, 1)
        self.autocast_in_step: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.autocast_in_step.append(torch.is_autocast_enabled("cpu"))
        return self(batch).sum() + batch_idx


class _CountingOptimizer(torch.optim.SGD):
    def __init__(self, params: Any) -> None:
        super().__init__(params, lr=0.1)
        self.steps = 0
        self.zeroed: list[bool] = []

    def step(self, closure: Any = None) -> Any:
        self.steps += 1
        return super().step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.zeroed.append(set_to_none)
        super().zero_grad(set_to_none)


def _set_up(strategy: SingleDeviceStrategy | None = None, **options: Any) -> tuple[Any, _Stepping, _CountingOptimizer]:
    strategy = strategy or stratagem.resolve(accelerator="cpu", devices=1, **options)
    module = strategy.setup_module(_Stepping())
    optimizer = _CountingOptimizer(module.parameters())
    return strategy, module, optimizer


def _one_step(strategy: Any, module: _Stepping, optimizer: _CountingOptimizer) -> torch.Tensor:
    calls = step_calls(strategy, "training_step", optimizer)
    batch = calls.batch_to_device(torch.ones(2, 3))
    loss = calls.run_step(batch, 1)
    calls.backward(loss)
    calls.optimizer_step(optimizer)
    calls.zero_grad(optimizer)
    return loss


def test_a_base_strategy_in_fp32_steps_through_the_direct_calls_with_the_same_effect():
    strategy, module, optimizer = _set_up()
    calls = step_calls(strategy, "training_step", optimizer)
    assert calls.backward is torch.Tensor.backward
    before = module.layer.weight.detach().clone()
    loss = _one_step(strategy, module, optimizer)
    assert loss.requires_grad
    assert module.autocast_in_step == [False]
    assert optimizer.steps == 1
    assert optimizer.zeroed == [True]
    assert not torch.equal(before, module.layer.weight)
    assert module.layer.weight.grad is None


def test_methods_a_strategy_overrides_on_its_class_or_instance_are_called_as_they_are():
    calls: list[str] = []

    class _Overriding(SingleDeviceStrategy):
        def backward(self, loss: torch.Tensor, optimizer: Any) -> None:
            calls.append(f"backward with {type(optimizer).__name__}")
            super().backward(loss, optimizer)

        def zero_grad(self, optimizer: Any) -> None:
            calls.append("zero_grad")
            super().zero_grad(optimizer)

    strategy = stratagem.resolve(accelerator="cpu", devices=1, strategy=_Overriding())
    strategy, module, optimizer = _set_up(strategy)
    optimizer_step = strategy.optimizer_step
    strategy.optimizer_step = lambda optimizer: (calls.append("optimizer_step"), optimizer_step(optimizer))[1]
    _one_step(strategy, module, optimizer)
    assert calls == ["backward with _CountingOptimizer", "optimizer_step", "zero_grad"]
    assert optimizer.steps == 1


def test_a_precision_with_an_autocast_context_gets_it_around_the_step():
    strategy, module, optimizer = _set_up(precision="bf16-mixed")
    _one_step(strategy, module, optimizer)
    assert module.autocast_in_step == [True]


def test_a_precision_that_casts_inputs_casts_the_batch():
    class _Halving(Precision):
        def convert_input(self, data: Any) -> Any:
            return data / 2

    strategy = stratagem.resolve(accelerator="cpu", devices=1, strategy=SingleDeviceStrategy(precision=_Halving()))
    strategy, _, optimizer = _set_up(strategy)
    calls = step_calls(strategy, "training_step", optimizer)
    assert torch.equal(calls.batch_to_device(torch.ones(2)), torch.full((2,), 0.5))


def test_forward_hooks_registered_after_the_calls_were_bound_still_run_around_the_step():
    strategy, module, optimizer = _set_up()
    calls = step_calls(strategy, "training_step", optimizer)
    seen: list[int] = []
    module.register_forward_pre_hook(lambda mod, args: seen.append(len(args)))
    calls.run_step(torch.ones(2, 3), 0)
    assert seen == [2, 1]
    assert "forward" not in module.__dict__


def test_a_batch_already_on_the_device_passes_through_and_others_are_moved():
    mover = device_mover(torch.device("cpu"))
    batch = (torch.ones(2), torch.zeros(2))
    assert mover(batch) is batch
    nested = {"x": torch.ones(2), "name": "a"}
    moved = mover(nested)
    assert moved["x"] is nested["x"]
    assert moved["name"] == "a"
    to_meta = device_mover(torch.device("meta"))(batch)
    assert [tensor.device.type for tensor in to_meta] == ["meta", "meta"]
