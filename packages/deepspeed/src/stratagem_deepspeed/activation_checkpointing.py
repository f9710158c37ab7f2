"""The config's ``activation_checkpointing`` section: checked in the calling process, applied in the workers.

DeepSpeed reads that section only through ``deepspeed.checkpointing.configure``, which needs the
process group; ``deepspeed.initialize`` does not call it. Without the call, ``partition_activations``
and the other switches would be written into the config and never take effect.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SECTION = "activation_checkpointing"


def check_activation_checkpointing(config: Mapping[str, Any], source: str) -> None:
    """A ``ValueError`` for combinations DeepSpeed would assert on in every worker."""
    section = config.get(SECTION) or {}
    if not isinstance(section, Mapping):
        raise ValueError(f"{source}: {SECTION!r} is a {type(section).__name__}; expected a section (a dict).")
    if not section.get("contiguous_memory_optimization"):
        return
    if not section.get("partition_activations"):
        raise ValueError(
            f"{source} enables {SECTION}.contiguous_memory_optimization without partition_activations; DeepSpeed "
            "copies only partitioned activations contiguously. Set partition_activations=True as well."
        )
    if not section.get("number_checkpoints"):
        raise ValueError(
            f"{source} enables {SECTION}.contiguous_memory_optimization, which needs {SECTION}.number_checkpoints "
            "(how many deepspeed.checkpointing.checkpoint calls one forward makes) to size its buffer. Add it."
        )


def configure_activation_checkpointing(config: Mapping[str, Any]) -> None:
    """Apply the section to ``deepspeed.checkpointing`` (in a worker, after ``deepspeed.initialize``)."""
    section = config.get(SECTION)
    if not section:
        return
    import deepspeed

    deepspeed.checkpointing.configure(
        mpu_=None,
        partition_activations=bool(section.get("partition_activations", False)),
        contiguous_checkpointing=bool(section.get("contiguous_memory_optimization", False)),
        num_checkpoints=section.get("number_checkpoints"),
        checkpoint_in_cpu=bool(section.get("cpu_checkpointing", False)),
        synchronize=bool(section.get("synchronize_checkpoint_boundary", False)),
        profile=bool(section.get("profile", False)),
    )
