"""Reading DeepSpeed's shard files: checking them as weights-only, gathering full fp32 weights."""

from __future__ import annotations

import contextlib
import io
import math
from pathlib import Path
from typing import Any

import torch

from stratagem.checkpoint_io import CheckpointError, checkpoint_files, load_torch_file


def deepspeed_checkpoint_globals() -> list[Any]:
    """The DeepSpeed classes its own checkpoint files pickle, besides tensors and containers."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


def check_shard_files(directory: Path, tag: str, weights_only: bool) -> None:
    """Refuse a checkpoint whose files DeepSpeed's reader must not open, before it opens any.

    Every file of the directory must lie inside it (a link out of it, a pipe or a device is refused,
    see :func:`stratagem.checkpoint_io.checkpoint_files`). With ``weights_only``, every ``.pt`` file of
    the tag, by the name DeepSpeed opens it under (in ``zero/`` too, also through links inside the
    directory), must hold only tensors, containers and DeepSpeed's known classes: DeepSpeed loads its
    files with ``weights_only=False``, so each is opened here first (memory-mapped: tensor bytes are
    not read).
    """
    files = checkpoint_files(directory)
    if not weights_only:
        return
    allowed = deepspeed_checkpoint_globals()
    tag_folder = Path(directory) / tag
    for path in files:
        if path.name.endswith(".pt") and path.is_relative_to(tag_folder):
            load_torch_file(path, weights_only=True, safe_globals=allowed, mmap=True)


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
        raise CheckpointError(f"{str(directory / tag)!r} holds no DeepSpeed model-states file.")
    state = load_torch_file(files[0], safe_globals=deepspeed_checkpoint_globals())
    return {name: value.float() if value.is_floating_point() else value for name, value in state["module"].items()}


def has_optimizer_shards(directory: Path, tag: str) -> bool:
    """Whether ``tag`` holds per-rank ZeRO optimizer shards (ZeRO stage 0 keeps none)."""
    return bool(_optimizer_files(directory, tag))


def _optimizer_files(directory: Path, tag: str) -> list[Path]:
    return sorted((directory / tag).glob("*zero_pp_rank_*_optim_states.pt"), key=_rank_of)


def gather_optimizer_state(directory: Path, tag: str) -> dict[str, Any]:
    """The optimizer's state as a plain ``Optimizer.state_dict()`` of the whole model (parameters
    numbered in the order DeepSpeed recorded them), assembled from the per-rank ZeRO shards.

    Raises :class:`CheckpointError` when ``tag`` holds no optimizer shards (see :func:`has_optimizer_shards`).
    """
    optimizer_files = _optimizer_files(directory, tag)
    if not optimizer_files:
        raise CheckpointError(f"{str(directory / tag)!r} holds no ZeRO optimizer shards.")
    allowed = deepspeed_checkpoint_globals()
    model_states = load_torch_file(_model_states_file(directory, tag), safe_globals=allowed)
    shards = [
        load_torch_file(path, safe_globals=allowed, mmap=True)["optimizer_state_dict"] for path in optimizer_files
    ]
    groups: list[dict[str, torch.Size]] = list(model_states["param_shapes"])
    if int(shards[0]["zero_stage"]) == 3:
        per_parameter = _merge_stage_3(shards, groups)
        saved_groups = shards[0]["optimizer_state_dict"]["param_groups"]
        groups = _join_sub_groups(groups, saved_groups)
    else:
        per_parameter = _merge_stages_1_2(shards, groups)
        saved_groups = shards[0]["base_optimizer_state"]["param_groups"]
    if len(saved_groups) != len(groups):
        raise CheckpointError(
            f"{str(directory / tag)!r}: {len(saved_groups)} optimizer groups for {len(groups)} parameter groups; "
            "the optimizer state cannot be mapped to parameters."
        )
    param_groups = []
    index = 0
    for saved, shapes in zip(saved_groups, groups):
        param_groups.append(
            {**{k: v for k, v in saved.items() if k != "params"}, "params": list(range(index, index + len(shapes)))}
        )
        index += len(shapes)
    return {"state": dict(enumerate(per_parameter)), "param_groups": param_groups}


def _join_sub_groups(
    groups: list[dict[str, torch.Size]], saved_groups: list[dict[str, Any]]
) -> list[dict[str, torch.Size]]:
    """Stage 3 records parameter shapes per sub-group (``sub_group_size``), and each optimizer group lists its
    sub-groups' flat partitions as its ``params``, in the same order: the shapes of each optimizer group."""
    counts = [len(saved["params"]) for saved in saved_groups]
    if sum(counts) != len(groups):
        return groups
    joined = []
    start = 0
    for count in counts:
        joined.append({name: shape for shapes in groups[start : start + count] for name, shape in shapes.items()})
        start += count
    return joined


def _rank_of(path: Path) -> int:
    return int(path.name.split("zero_pp_rank_")[1].split("_")[0])


def _model_states_file(directory: Path, tag: str) -> Path:
    for pattern in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt"):
        if (directory / tag / pattern).is_file():
            return directory / tag / pattern
    raise CheckpointError(f"{str(directory / tag)!r} holds no DeepSpeed model-states file.")


def _merge_stages_1_2(shards: list[dict[str, Any]], groups: list[dict[str, torch.Size]]) -> list[dict[str, Any]]:
    # Each rank's optimizer steps one slice of every group's flat buffer; param_slice_mappings
    # says where each parameter's fragment lies in that slice.
    merged = []
    for group_index, shapes in enumerate(groups):
        flat_states = [shard["base_optimizer_state"]["state"][group_index] for shard in shards]
        for name, shape in shapes.items():
            fragments: dict[str, list[torch.Tensor]] = {}
            for shard, flat in zip(shards, flat_states):
                address = shard["param_slice_mappings"][group_index].get(name)
                if address is None:
                    continue
                for key, value in flat.items():
                    if isinstance(value, torch.Tensor) and value.dim() == 1:
                        fragments.setdefault(key, []).append(value.narrow(0, address.start, address.numel))
            merged.append(_per_parameter(flat_states[0], fragments, shape))
    return merged


def _merge_stage_3(shards: list[dict[str, Any]], groups: list[dict[str, torch.Size]]) -> list[dict[str, Any]]:
    # Every parameter is split into world_size equal (padded) parts; rank r's flat buffers hold
    # part r of each parameter, one after the other in DeepSpeed's recorded order.
    world_size = len(shards)
    if not shards[0]["optimizer_state_dict"]["state"]:
        # A stateless optimizer (SGD without momentum) keeps nothing per parameter.
        return [{} for shapes in groups for _ in shapes]
    flat_by_rank = []
    for shard in shards:
        states = shard["optimizer_state_dict"]["state"]
        keys = [key for key, value in states[0].items() if isinstance(value, torch.Tensor) and value.dim() == 1]
        flat_by_rank.append({key: torch.cat([states[index][key] for index in sorted(states)]) for key in keys})
    first_group_state = shards[0]["optimizer_state_dict"]["state"][0]
    merged = []
    offset = 0
    for shape in (shape for shapes in groups for shape in shapes.values()):
        numel = math.prod(shape)
        part = math.ceil(numel / world_size)
        fragments = {key: [flat[key].narrow(0, offset, part) for flat in flat_by_rank] for key in flat_by_rank[0]}
        merged.append(_per_parameter(first_group_state, fragments, shape, numel))
        offset += part
    return merged


def _per_parameter(
    group_state: dict[str, Any], fragments: dict[str, list[torch.Tensor]], shape: torch.Size, numel: int | None = None
) -> dict[str, Any]:
    # Per-group scalars (Adam's step count) apply to every parameter of the group.
    state: dict[str, Any] = {
        key: value.clone() if isinstance(value, torch.Tensor) else value
        for key, value in group_state.items()
        if not (isinstance(value, torch.Tensor) and value.dim() == 1)
    }
    for key, pieces in fragments.items():
        whole = torch.cat(pieces)
        state[key] = (whole[:numel] if numel is not None else whole).reshape(shape).clone()
    return state
