"""``habana_frameworks.torch.core``: lazy-mode control."""

from __future__ import annotations

import os

from habana_frameworks import record


def mark_step() -> None:
    """In lazy mode, Habana's bridge runs the operations recorded since the last call as one graph; here only
    the call and its place are recorded."""
    record("mark_step")


def is_lazy() -> bool:
    """Whether the bridge records operations lazily: ``PT_HPU_LAZY_MODE`` (``"1"`` unless set otherwise)."""
    return os.environ.get("PT_HPU_LAZY_MODE", "1") == "1"
