"""The order in which a run drives its strategy, in every worker: the one place that order is written down.

Both drivers go through it: :class:`stratagem.Runtime` (a user's own loop) and the Trainer. A call out of
order is a ``RuntimeError`` naming what must come first, so that neither driver can drift from the other::

    start()                                   setup_environment: device, process group, mesh
    with module_init_context(empty_init):     build the module on the target device and dtype
        ...
    setup_module(module)                      user-compiled submodules made in-place; wrap; requested weights
    setup_optimizers(optimizers, schedulers)  adopt the optimizers made for the set-up module, then their schedulers
    compile(settings)                         compile the wrapped module in place (optional)
    teardown()                                release what start() and setup acquired (always, also on error)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from torch import nn
from torch.optim import Optimizer

from stratagem.strategies.capabilities import TakesLRSchedulers
from stratagem.strategies.compilation import CompileSettings, compile_submodules_in_place

if TYPE_CHECKING:
    from stratagem.strategies import Strategy


class _Stage(IntEnum):
    NOT_STARTED = 0
    STARTED = 1
    MODULE_SET_UP = 2
    OPTIMIZERS_SET_UP = 3


class StrategyLifecycle:
    """One run of one strategy in this process, stepped through in the documented order."""

    def __init__(self, strategy: Strategy) -> None:
        self.strategy = strategy
        self._stage = _Stage.NOT_STARTED

    @property
    def started(self) -> bool:
        """Whether :meth:`start` ran and :meth:`teardown` has not yet."""
        return self._stage >= _Stage.STARTED

    @property
    def module_is_set_up(self) -> bool:
        return self._stage >= _Stage.MODULE_SET_UP

    @property
    def optimizers_are_set_up(self) -> bool:
        return self._stage >= _Stage.OPTIMIZERS_SET_UP

    def start(self) -> None:
        """Prepare this process for the run (the strategy's ``setup_environment``)."""
        if self._stage != _Stage.NOT_STARTED:
            raise RuntimeError("This run has started already; a strategy runs one run at a time.")
        self.strategy.setup_environment()
        self._stage = _Stage.STARTED

    @contextlib.contextmanager
    def module_init_context(self, empty_init: bool | None = None) -> Iterator[None]:
        """The strategy's context for building the module (see ``Strategy.module_init_context``)."""
        self._require(_Stage.STARTED, "building the module in the strategy's init context")
        with self.strategy.module_init_context(empty_init):
            yield

    def setup_module(self, module: nn.Module) -> nn.Module:
        """Wrap ``module`` by the strategy and load the pretrained weights it asked for; return the wrapped one."""
        self._require(_Stage.STARTED, "setup_module")
        if self._stage >= _Stage.MODULE_SET_UP:
            raise RuntimeError(
                "setup_module was called twice in one run: the strategy wraps, checkpoints and tears down one module "
                "per run. Put the parts in one nn.Module."
            )
        compile_submodules_in_place(module)
        model = self.strategy.setup_module(module)
        load_requested_weights(self.strategy, module)
        self._stage = _Stage.MODULE_SET_UP
        return model

    def setup_optimizers(self, optimizers: list[Optimizer], lr_schedulers: Sequence[Any] = ()) -> list[Optimizer]:
        """Hand the optimizers made for the set-up module to the strategy, then the learning-rate schedulers made for
        them to a strategy that :class:`~stratagem.strategies.TakesLRSchedulers` (one that steps them itself, or joins
        a swarm with them, does it there; an own loop has made none yet); return the optimizers to step."""
        self._require(_Stage.MODULE_SET_UP, "setup_optimizers")
        if self._stage >= _Stage.OPTIMIZERS_SET_UP:
            raise RuntimeError("setup_optimizers was called twice in one run; pass every optimizer in one call.")
        adopted = self.strategy.setup_optimizers(optimizers)
        if isinstance(self.strategy, TakesLRSchedulers):
            self.strategy.check_lr_schedulers(list(lr_schedulers))
        self._stage = _Stage.OPTIMIZERS_SET_UP
        return adopted

    def compile(self, settings: CompileSettings) -> None:
        """Compile the wrapped module in place, after every wrapper the strategy adds (the optimizers' too)."""
        self._require(_Stage.MODULE_SET_UP, "compile")
        self.strategy.compile_module(settings)

    def teardown(self) -> None:
        """Release what the run acquired; does nothing when the run never started."""
        if self._stage == _Stage.NOT_STARTED:
            return
        self._stage = _Stage.NOT_STARTED
        self.strategy.teardown()

    def _require(self, stage: _Stage, action: str) -> None:
        if self._stage < stage:
            needed = {
                _Stage.STARTED: "the run has started (inside Runtime.launch(fn), or a Trainer run)",
                _Stage.MODULE_SET_UP: "setup_module",
            }[stage]
            raise RuntimeError(f"{action} comes after {needed}.")


def load_requested_weights(strategy: Strategy, module: nn.Module) -> None:
    """Load what ``Module.load_pretrained`` asked for into the module the strategy has just set up, once."""
    from stratagem.checkpoint_io.safetensors_import import SafetensorsWeights

    requests: list[Any] = module.__dict__.pop("_pretrained_requests", [])
    for request in requests:
        with SafetensorsWeights(request.directory) as weights:
            strategy.load_pretrained(request.target, weights)
