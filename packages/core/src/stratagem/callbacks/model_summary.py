"""ModelSummary: what is being trained, and what each rank holds of it under the strategy, said once at the start."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from torch import nn

from stratagem.callbacks.callback import Callback
from stratagem.planning import model_footprint
from stratagem.planning.planner import size_text
from stratagem.strategies.memory import replicated_estimate

if TYPE_CHECKING:
    from stratagem.module import Module
    from stratagem.strategies import Strategy
    from stratagem.trainer.trainer import Trainer


class ModelSummary(Callback):
    """Print on global rank 0, to stderr, when fitting starts: the model's parameters (all, and trainable, as
    ``configure_model`` builds them), what each rank holds at its peak under the strategy as the planner
    estimates it (``stratagem plan`` shows it for every strategy), and, when ``strategy="auto"`` kept its usual
    choice, why. ``Trainer(enable_model_summary=False)`` leaves it out.

    The model is measured in the calling process before any worker starts, on a copy on the meta device: the
    module itself is not touched, and measuring costs no memory.
    """

    def __init__(self) -> None:
        self.lines: list[str] = []

    def describe(self, module: nn.Module, strategy: Strategy, auto_choice: str | None = None) -> None:
        """Measure ``module`` for the summary :meth:`on_fit_start` prints (the Trainer calls it as ``fit`` starts,
        in the calling process); ``auto_choice`` is ``auto``'s one-line reason when it kept its usual choice."""
        self.lines = summary_lines(module, strategy, auto_choice)

    def on_fit_start(self, trainer: Trainer, module: Module) -> None:
        if trainer.is_global_zero:
            for line in self.lines:
                print(line, file=sys.stderr, flush=True)


def summary_lines(module: nn.Module, strategy: Strategy, auto_choice: str | None = None) -> list[str]:
    """The summary's lines, each starting ``stratagem: ``."""
    name = type(module).__name__
    lines = [f"stratagem: {auto_choice}"] if auto_choice is not None else []
    try:
        footprint, _ = model_footprint(module, strategy.precision)
        estimate = strategy.estimate_memory(footprint)
    except Exception as error:  # a module whose meta copy cannot be built is still trained, unmeasured
        return [*lines, f"stratagem: {name} could not be measured ({type(error).__name__}: {error})"]
    built = footprint.module
    trainable = sum(p.numel() for p in built.parameters() if p.requires_grad) if built is not None else 0
    lines.insert(
        0,
        f"stratagem: {name}: {footprint.parameters:,} parameters ({trainable:,} trainable), "
        f"{size_text(footprint.parameter_bytes)} of weights",
    )
    processes = strategy.world_size
    where = [f"{size_text(estimate.device_bytes)} on its {strategy.root_device.type}"]
    if estimate.host_bytes:
        where.append(f"{size_text(estimate.host_bytes)} of host memory")
    if estimate.disk_bytes:
        where.append(f"{size_text(estimate.disk_bytes)} on disk")
    whole = replicated_estimate(footprint)
    held = estimate.device_bytes + estimate.host_bytes + estimate.disk_bytes
    share = f"; {held / whole.device_bytes:.0%} of one unsplit copy" if whole.device_bytes else ""
    lines.insert(
        1,
        f"stratagem: {type(strategy).__name__}, {processes} process{'es' if processes != 1 else ''}: each rank holds "
        f"about {' + '.join(where)} at its peak (planner's estimate{share})",
    )
    return lines
