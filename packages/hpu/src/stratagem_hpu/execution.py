"""How Habana's bridge runs a module: lazily with ``mark_step`` graph cuts, eagerly, or ``torch.compile``-d."""

from __future__ import annotations

import os
from typing import Literal, get_args

from torch import nn

from stratagem_hpu import habana

ExecutionMode = Literal["lazy", "eager", "compile"]
LAZY_MODE_VARIABLE = "PT_HPU_LAZY_MODE"
"""Habana's bridge reads this once, when it loads: ``1`` records operations lazily, ``0`` runs them eagerly."""


def check_execution_mode(mode: object) -> ExecutionMode:
    """``mode``, refused with the accepted values when it is none of them."""
    if mode not in get_args(ExecutionMode):
        accepted = ", ".join(repr(value) for value in get_args(ExecutionMode))
        raise ValueError(f"execution_mode={mode!r} is not valid; expected one of {accepted}.")
    return mode  # type: ignore[return-value]


def set_lazy_mode_variable(mode: ExecutionMode) -> None:
    """Set ``PT_HPU_LAZY_MODE`` for this process and the ranks it starts, before any loads the bridge: lazy mode
    for ``"lazy"``, eager for the others (``torch.compile`` on Gaudi runs in eager mode). A value the user set
    that contradicts ``mode`` is a ``ValueError`` naming both."""
    wanted = "1" if mode == "lazy" else "0"
    current = os.environ.get(LAZY_MODE_VARIABLE)
    if current is not None and current != wanted:
        raise ValueError(
            f"execution_mode={mode!r} needs {LAZY_MODE_VARIABLE}={wanted}, but the environment sets "
            f"{LAZY_MODE_VARIABLE}={current}. Unset it, or choose "
            f"execution_mode={'lazy' if current == '1' else 'eager'!r}."
        )
    os.environ[LAZY_MODE_VARIABLE] = wanted


def compile_module(module: nn.Module) -> None:
    """Compile ``module``'s calls in place with Habana's ``torch.compile`` backend."""
    module.compile(backend=habana.compile_backend())


def cut_graph() -> None:
    """Run what lazy mode recorded so far as one graph (Habana's ``mark_step``)."""
    habana.core().mark_step()
