"""Turning a DeepSpeed checkpoint directory into one file that plain ``torch.load`` reads."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from stratagem.checkpoint_io import TorchCheckpointIO
from stratagem_deepspeed.checkpoint_io import read_checkpoint


def convert_zero_checkpoint_to_fp32_state_dict(
    checkpoint_dir: str | os.PathLike[str],
    output_file: str | os.PathLike[str],
    tag: str | None = None,
    weights_only: bool = True,
) -> dict[str, Any]:
    """Write the checkpoint in ``checkpoint_dir`` as one file: ``{"module": fp32 weights, **plain entries}``.

    The weights are gathered from the ZeRO shards of ``tag`` (default: the one ``latest`` names);
    the file is written atomically and is returned as well. Unlike DeepSpeed's function of the
    same name, it writes one file (not a directory) and keeps the training loop's entries.
    """
    checkpoint = dict(read_checkpoint(Path(checkpoint_dir), tag=tag, weights_only=weights_only))
    TorchCheckpointIO().save_checkpoint(checkpoint, Path(output_file))
    return checkpoint
