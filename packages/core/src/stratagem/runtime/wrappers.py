"""What :class:`stratagem.Runtime` hands back from ``setup``: the module, optimizers and loaders of a user's loop,
each routed through the strategy where the strategy has a say (forward, the optimizer step, batches)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as _torch_module
from torch.optim import Optimizer

from stratagem.precision import Precision
from stratagem.strategies.step_calls import PLAIN_ZERO_GRAD


class RuntimeModule(nn.Module):
    """The user's module as the strategy set it up; calling it runs the strategy's wrapper (DDP, the FSDP root,
    an engine) under the precision's forward context, with floating-point inputs in the precision's dtype, and
    returns what the precision makes of the outputs for the loss computed outside it (fp32 under autocast).

    Attributes the module has are read from it (``model.config``, ``model.generate``); ``state_dict`` and
    ``load_state_dict`` are the module's own, with its own keys. :attr:`module` is the unwrapped module.
    """

    def __init__(self, model: nn.Module, module: nn.Module, precision: Precision) -> None:
        super().__init__()
        # Not a registered child: it sits inside the wrapper already (or is the wrapper).
        self.__dict__["_original_module"] = module
        self.__dict__["_precision"] = precision
        self.wrap_with(model)

    def wrap_with(self, model: nn.Module) -> None:
        """Call ``model`` from now on: the strategy's wrapper, which an engine built with the optimizers replaces."""
        self._forward_module = model
        precision = self.__dict__["_precision"]
        plain = all(
            _inherited(precision, name, getattr(Precision, name))
            for name in ("convert_input", "forward_context", "convert_output")
        )
        # Decided once: fp32 neither casts nor enters a context per call.
        self.__dict__["_call_wrapped"] = model.__call__ if plain else functools.partial(_precise_call, model, precision)
        self.__dict__["_direct_module"] = model if plain else None

    @property
    def module(self) -> nn.Module:
        """The user's module, unwrapped."""
        return self.__dict__["_original_module"]  # type: ignore[no-any-return]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # nn.Module's dispatch is three Python frames per call, paid twice here (the wrapper, then the module),
        # which a small model's step feels (tools/bench/own_loop). Where neither is hooked or compiled, nothing
        # is traced and the precision leaves the call alone, that dispatch would call the module's forward and
        # nothing else: so that is called directly. The checks read the instance dicts: an attribute of a module
        # goes through nn.Module.__getattr__'s slow lookup, a dozen of them per call.
        own = self.__dict__
        direct = own["_direct_module"]
        if direct is not None:
            inner = direct.__dict__
            if not (
                own["_forward_pre_hooks"]
                or own["_forward_hooks"]
                or own["_backward_pre_hooks"]
                or own["_backward_hooks"]
                or inner["_forward_pre_hooks"]
                or inner["_forward_hooks"]
                or inner["_backward_pre_hooks"]
                or inner["_backward_hooks"]
                or own.get("_compiled_call_impl") is not None
                or inner.get("_compiled_call_impl") is not None
                or any(_GLOBAL_MODULE_HOOKS)
                or torch._C._get_tracing_state()
            ):
                return direct.forward(*args, **kwargs)
        return super().__call__(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.__dict__["_call_wrapped"](*args, **kwargs)

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "_original_module" or "_original_module" not in self.__dict__:
                raise
            return getattr(self.__dict__["_original_module"], name)


# The hooks registered for every module (``register_module_forward_hook`` and the like): dicts torch fills in place.
_GLOBAL_MODULE_HOOKS = tuple(
    getattr(_torch_module, name)
    for name in (
        "_global_forward_pre_hooks",
        "_global_forward_hooks",
        "_global_backward_pre_hooks",
        "_global_backward_hooks",
    )
)


def _precise_call(model: nn.Module, precision: Precision, *args: Any, **kwargs: Any) -> Any:
    args, kwargs = precision.convert_input((args, kwargs))
    with precision.forward_context():
        output = model(*args, **kwargs)
    return precision.convert_output(output)


class RuntimeOptimizer:
    """An optimizer whose ``step`` and ``zero_grad`` go through the strategy (loss scaling, an engine's step,
    a step boundary); everything else is the optimizer's own, so learning-rate schedulers take it as they take
    the optimizer (it is an instance of the optimizer's class). :attr:`optimizer` is the unwrapped one."""

    # Read and written on the wrapped optimizer, so that loading its state or adding a group is seen by both.
    state = property(lambda self: self.optimizer.state, lambda self, value: setattr(self.optimizer, "state", value))
    param_groups = property(
        lambda self: self.optimizer.param_groups, lambda self, value: setattr(self.optimizer, "param_groups", value)
    )
    defaults = property(
        lambda self: self.optimizer.defaults, lambda self, value: setattr(self.optimizer, "defaults", value)
    )

    optimizer: Optimizer
    _runtime_step: Callable[[Optimizer], Any]
    _runtime_zero_grad: Callable[[Optimizer], None]

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        if closure is not None:
            raise TypeError(
                "optimizer.step(closure) is not supported by Runtime optimizers: the strategy steps the optimizer "
                "(and a precision may skip the step); compute the loss and call runtime.backward(loss) before step()."
            )
        return self._runtime_step(self.optimizer)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if set_to_none:
            self._runtime_zero_grad(self.optimizer)
        else:
            self.optimizer.zero_grad(set_to_none=False)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    def __getattr__(self, name: str) -> Any:
        # Only for what the wrapper itself lacks (the optimizer's hooks, its other attributes).
        if name == "optimizer" or "optimizer" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["optimizer"], name)

    def __repr__(self) -> str:
        return f"RuntimeOptimizer({self.optimizer!r})"


def wrap_optimizer(
    optimizer: Optimizer, step: Callable[[Optimizer], Any], zero_grad: Callable[[Optimizer], None]
) -> RuntimeOptimizer:
    """``optimizer`` with its ``step``/``zero_grad`` replaced by ``step(optimizer)``/``zero_grad(optimizer)``."""
    wrapper: RuntimeOptimizer = object.__new__(_wrapper_class(type(optimizer)))
    wrapper.__dict__.update(optimizer=optimizer, _runtime_step=step, _runtime_zero_grad=zero_grad)
    if zero_grad is PLAIN_ZERO_GRAD:
        # The strategy's zero_grad is the optimizer's own, with the same signature: called without a frame of ours.
        wrapper.__dict__["zero_grad"] = optimizer.zero_grad
    return wrapper


def _wrapper_class(optimizer_class: type[Optimizer]) -> type[RuntimeOptimizer]:
    """``RuntimeOptimizer`` mixed into the optimizer's class (one per class), so that isinstance checks hold."""
    made = _WRAPPER_CLASSES.get(optimizer_class)
    if made is None:
        made = type(f"Runtime{optimizer_class.__name__}", (RuntimeOptimizer, optimizer_class), {})
        _WRAPPER_CLASSES[optimizer_class] = made
    return made


_WRAPPER_CLASSES: dict[type[Optimizer], type[RuntimeOptimizer]] = {}


class RuntimeDataLoader:
    """A dataloader whose batches arrive on the strategy's device (through its own device loader where it has
    one). Each iteration is the next epoch for an epoch-aware sampler (a ``DistributedSampler`` reshuffles);
    :meth:`set_epoch` chooses the next one. Other attributes are the loader's own."""

    def __init__(
        self,
        loader: Iterable[Any],
        to_device: Callable[[Any], Any] | None,
        feed: Callable[[Iterator[Any]], Iterator[Any]] | None,
    ) -> None:
        self.loader = loader
        self._to_device = to_device
        self._feed = feed
        self._epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration reads (its sampler's shuffle); later iterations count on from it."""
        self._epoch = epoch

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        from stratagem.trainer.data import set_epoch

        set_epoch(self.loader, self._epoch)
        self._epoch += 1
        batches: Iterator[Any] = iter(self.loader)
        if self._feed is not None:
            batches = self._feed(batches)
        if self._to_device is None:
            return batches
        return map(self._to_device, batches)

    def __getattr__(self, name: str) -> Any:
        if name == "loader" or "loader" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["loader"], name)


def _inherited(owner: object, name: str, base_function: Callable[..., Any]) -> bool:
    return getattr(getattr(owner, name), "__func__", None) is base_function


def unwrapped(value: Any) -> Any:
    """``value`` with Runtime wrappers replaced by what they wrap (in lists and tuples too)."""
    if isinstance(value, RuntimeModule):
        return value.module
    if isinstance(value, RuntimeOptimizer):
        return value.optimizer
    if isinstance(value, list | tuple) and any(isinstance(item, RuntimeModule | RuntimeOptimizer) for item in value):
        return type(value)(unwrapped(item) for item in value)
    return value
