"""The Precision interface: dtypes, autocast and gradient scaling around a strategy's steps."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

if TYPE_CHECKING:
    from torch.optim import Optimizer

    from stratagem.accelerators import Accelerator


class Precision:
    """Numerical precision of training. The base class is plain fp32 (``"32-true"``).

    Every method here has a working default; a precision overrides only what it changes.
    Strategies call these hooks; the Trainer never calls them directly.
    """

    name: ClassVar[str] = "32-true"
    """The canonical name this precision is registered under."""

    param_dtype: torch.dtype = torch.float32
    """dtype that parameters are created in and kept in."""

    exact: bool = True
    """Whether training computes in at least fp32 throughout, so that its results may be compared with
    an fp32 run at fp32's tolerance. ``False`` for precisions that round to fewer bits (bf16, fp16,
    autocast); tools that compare runs (the conformance kit) then use a looser tolerance. A precision
    plugin declares it here rather than being recognised by its name."""

    def check_accelerator(self, accelerator: Accelerator) -> None:
        """Raise ``ValueError`` saying what would work if this precision cannot run on ``accelerator``."""

    def check_optimizer(self, optimizer: Optimizer) -> None:
        """Raise ``ValueError`` naming the setting if ``optimizer`` cannot train in this precision (called
        once per optimizer when a run adopts it, before the first step)."""

    def module_init_context(self) -> contextlib.AbstractContextManager[Any]:
        """Context in which modules are created, so parameters come out in :attr:`param_dtype`."""
        return _default_dtype(self.param_dtype)

    def convert_module(self, module: nn.Module) -> nn.Module:
        """Cast a module created elsewhere to this precision's parameter dtype."""
        return module if self.param_dtype == torch.float32 else module.to(dtype=self.param_dtype)

    def convert_input(self, data: Any) -> Any:
        """Cast floating-point inputs of a batch to the dtype the module expects."""
        return data

    def forward_context(self) -> contextlib.AbstractContextManager[Any]:
        """Context around every forward (training, validation, test, predict) step."""
        return contextlib.nullcontext()

    def convert_output(self, data: Any) -> Any:
        """Cast what a module's forward returned for code that runs outside :meth:`forward_context` (an own loop's
        loss, see :class:`stratagem.Runtime`), so that it computes as it would inside the context."""
        return data

    def backward(self, loss: torch.Tensor, backward: Callable[[torch.Tensor], None]) -> None:
        """Run ``backward(loss)``, scaling the loss first where this precision needs it."""
        backward(loss)

    def unscale_gradients(self, optimizer: Optimizer) -> None:
        """Bring gradients back to their true scale before clipping or inspection."""

    @property
    def skips_nonfinite_gradients(self) -> bool:
        """True when :meth:`optimizer_step` itself skips steps whose gradients are not finite (a loss scaler
        does, while it searches for its scale): the Trainer then leaves such gradients to it."""
        return False

    def optimizer_step(self, optimizer: Optimizer, step: Callable[[], Any]) -> Any:
        """Run ``step()`` (the optimizer's step), skipping it where gradients overflowed."""
        return step()

    def state_dict(self) -> dict[str, Any]:
        """State to keep in a checkpoint (a gradient scaler's scale, for example)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def teardown(self) -> None:
        """Undo any process-wide change this precision made."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)
