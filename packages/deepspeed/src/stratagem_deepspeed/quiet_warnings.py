"""Warnings that DeepSpeed's own code raises from torch, about calls the user did not make and cannot change.

A 20-step two-process ``deepspeed_stage_3`` fit printed 82 FutureWarning lines: DeepSpeed's comm layer calls
``all_gather_into_tensor`` and ``reduce_scatter_tensor``, which torch deprecates, and torch re-raises the warning
whenever the warnings registry is reset. Each is ignored by its message and by the torch module that raises it, so
every other warning (and these same messages' siblings) still reaches the user.
"""

from __future__ import annotations

import warnings

UNINFORMATIVE_WARNINGS: tuple[tuple[str, type[Warning], str], ...] = (
    # (message regex, category, module regex of the frame warnings.warn attributes it to)
    (
        r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated",
        FutureWarning,
        r"torch\.distributed\.c10d_logger",
    ),
    # Raised while torch.utils.mkldnn is imported, which deepspeed.initialize does through torch.compile when it
    # imports its Muon optimizer, whatever optimizer the run uses.
    (r"`torch\.jit\.script_method` is deprecated", DeprecationWarning, r"torch\.jit\._script"),
)


def ignore_uninformative_warnings() -> None:
    """Ignore :data:`UNINFORMATIVE_WARNINGS` in this process (adding a filter that is there already replaces it)."""
    for message, category, module in UNINFORMATIVE_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
