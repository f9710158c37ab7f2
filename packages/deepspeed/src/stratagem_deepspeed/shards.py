"""Reading DeepSpeed's shard files: checking them as weights-only, gathering full fp32 weights."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import torch


def deepspeed_checkpoint_globals() -> list[Any]:
    """The DeepSpeed classes its own checkpoint files pickle, besides tensors and containers."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


def check_weights_only(directory: Path, tag: str) -> None:
    """Refuse shard files that hold anything but tensors, containers and DeepSpeed's known classes.

    DeepSpeed itself loads its files with ``weights_only=False``; opening each one here first
    (memory-mapped, so tensor bytes are not read) keeps a weights-only load safe.
    """
    allowed = deepspeed_checkpoint_globals()
    for path in sorted((directory / tag).glob("*.pt")):
        try:
            with torch.serialization.safe_globals(allowed):
                torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        except Exception as error:
            lines = str(error).splitlines()
            reason = next((line.strip() for line in lines if "WeightsUnpickler error" in line), type(error).__name__)
            raise RuntimeError(
                f"{str(path)!r} holds objects that a weights-only load refuses ({reason}). If you trust the "
                "checkpoint, load it with weights_only=False."
            ) from error


def gather_fp32_weights(directory: Path, tag: str) -> dict[str, torch.Tensor]:
    """The module's full state dict in fp32, assembled from the ZeRO shards of ``tag``."""
    if not list((directory / tag).glob("*optim_states.pt")):
        return _unsharded_module_state(directory, tag)
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    # DeepSpeed's consolidation prints its progress; the caller gets the result, not the chatter.
    with contextlib.redirect_stdout(io.StringIO()):
        state = get_fp32_state_dict_from_zero_checkpoint(str(directory), tag=tag)
    return dict(state)


def _unsharded_module_state(directory: Path, tag: str) -> dict[str, torch.Tensor]:
    # ZeRO stage 0 keeps the whole module in rank 0's model-states file and no optimizer shards.
    files = sorted((directory / tag).glob("*mp_rank_00_model_states.pt"))
    if not files:
        raise ValueError(f"{str(directory / tag)!r} holds no DeepSpeed model-states file.")
    with torch.serialization.safe_globals(deepspeed_checkpoint_globals()):
        state = torch.load(files[0], map_location="cpu", weights_only=True)
    return {name: value.float() if value.is_floating_point() else value for name, value in state["module"].items()}
