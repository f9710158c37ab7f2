"""What every rank must see alike before a run: the checkpoint it starts from, and the checkpoint
directories, one filesystem for every node.

Each process resolves ``ckpt_path`` itself (with torchrun, srun or mpirun, each is a caller). On
filesystems the nodes do not share, or whenever one node sees another newest file, ranks would start
from different states and train with garbage; here global rank 0 decides and every rank checks that it
can read what rank 0 chose, failing together, naming the hosts, before anything is loaded.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from stratagem.checkpoint_io import CheckpointError

if TYPE_CHECKING:
    from stratagem.runtime import Runtime
    from stratagem.trainer.trainer import Trainer

_SHARED_STORAGE_ADVICE = (
    "Put the checkpoint directory (ModelCheckpoint(dirpath=...), or the Trainer's default_root_dir) on a "
    "filesystem every node mounts at the same path (NFS, Lustre, a cloud file share)"
)


def agree_on_checkpoint(trainer: Trainer, checkpoint: str | None) -> str | None:
    """The checkpoint global rank 0 resolved, once every rank has checked that it can read it; a
    :class:`~stratagem.checkpoint_io.CheckpointError` on every rank, naming the hosts, otherwise."""
    runtime = trainer.runtime
    if runtime.world_size == 1:
        return checkpoint
    chosen = runtime.broadcast(checkpoint)
    reports = gather_reports(runtime, {"own": checkpoint, "problem": _unreadable(chosen) if chosen is not None else ""})
    zero = reports[0]
    if chosen is None:
        others = {rank: report for rank, report in enumerate(reports) if report["own"] is not None}
        if others:
            found = "; ".join(f"{_where(rank, report)} found {report['own']}" for rank, report in others.items())
            raise CheckpointError(
                f"The ranks resolved ckpt_path to different checkpoints: {_where(0, zero)} found none and would "
                f"train from scratch, but {found}. Every rank must start from the same state: the nodes do not see "
                f"the same checkpoint directory. {_SHARED_STORAGE_ADVICE}, or pass ckpt_path the same path, "
                "present on every node."
            )
        return None
    failing = {rank: report for rank, report in enumerate(reports) if report["problem"]}
    if failing:
        raise CheckpointError(
            f"{_where(0, zero).capitalize()} resumes from {chosen!r}, which {_by_host(failing)} cannot read. Every "
            f"rank must start from the same checkpoint: {_SHARED_STORAGE_ADVICE}, or copy the checkpoint to the "
            "same path on every node."
        )
    return chosen


def check_checkpoint_directories_shared(trainer: Trainer) -> None:
    """Before training: whether every rank sees the directories the ModelCheckpoints of global rank 0 save
    into, by a marker file rank 0 writes there and every rank looks for.

    Where some rank does not see it and the strategy writes each checkpoint from every rank (shards), the
    checkpoints would be incomplete: raise on every rank. Where rank 0 writes alone, warn: its checkpoints
    exist on its node only.
    """
    runtime = trainer.runtime
    if runtime.world_size == 1:
        return
    directories = sorted({str(callback.dirpath) for callback in trainer.checkpoint_callbacks if callback.dirpath})
    marker = f".stratagem-shared-{uuid.uuid4().hex}"
    written: list[Path] = []
    if runtime.is_global_zero:
        for directory in directories:
            path = Path(directory, marker)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
                written.append(path)
            except OSError:
                continue  # then rank 0 sees no marker there either, and says so below
    directories, marker = runtime.broadcast((directories, marker))
    if not directories:
        return
    try:
        runtime.barrier("checkpoint directories shared")
        missing = [directory for directory in directories if not Path(directory, marker).exists()]
        reports = gather_reports(runtime, {"missing": missing})
    finally:
        for path in written:
            path.unlink(missing_ok=True)
    lacking = {rank: report for rank, report in enumerate(reports) if report["missing"]}
    mine = set(reports[runtime.global_rank]["missing"])
    for callback in trainer.checkpoint_callbacks:
        # Where this node does not see the files rank 0 writes, their paths say which host holds them.
        callback.files_host = reports[0]["host"] if str(callback.dirpath) in mine else None
    if not lacking:
        return
    unseen = sorted({directory for report in lacking.values() for directory in report["missing"]})
    what = (
        f"The checkpoint directory {', '.join(map(repr, unseen))} is not one filesystem for every node: "
        f"{_where(0, reports[0])} created a file there that {_by_host(lacking)} cannot see"
    )
    if runtime.strategy.checkpoint_written_by_every_rank:
        raise RuntimeError(
            f"{what}. {type(runtime.strategy).__name__} writes each checkpoint from every rank (each its shards), so "
            f"every checkpoint would be incomplete. {_SHARED_STORAGE_ADVICE}; or save whole checkpoints from rank 0 "
            "(fsdp: state_dict_type='full')."
        )
    if runtime.is_global_zero:
        warnings.warn(
            f"{what}. Rank 0 writes every checkpoint alone, so they exist on its node only: on the other nodes "
            f"ModelCheckpoint's best_model_path and last_model_path read '{reports[0]['host']}:<path>', naming "
            "this host, and resuming with ckpt_path='last' fails there. "
            f"{_SHARED_STORAGE_ADVICE}.",
            stacklevel=2,
        )


def gather_reports(runtime: Runtime, report: dict[str, Any]) -> list[dict[str, Any]]:
    """``report`` (a JSON-able dict) of every rank, in rank order, each with its ``host`` added."""
    data = json.dumps({**report, "host": socket.gethostname()}).encode()
    device = runtime.device
    length = torch.tensor([len(data)], dtype=torch.int64, device=device)
    lengths = runtime.all_gather(length).reshape(-1).tolist()
    buffer = torch.zeros(max(lengths), dtype=torch.uint8, device=device)
    buffer[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    rows = runtime.all_gather(buffer).reshape(len(lengths), -1).cpu()
    return [json.loads(bytes(row[:size].tolist())) for row, size in zip(rows, lengths)]


def _unreadable(path: str) -> str:
    """Why this process cannot read the checkpoint at ``path`` ("" when it can)."""
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            with open(path, "rb") as file:
                file.read(1)
    except OSError as error:
        return error.strerror or type(error).__name__
    return ""


def _where(rank: int, report: dict[str, Any]) -> str:
    return f"rank {rank} (host {report['host']})"


def _by_host(reports: dict[int, dict[str, Any]]) -> str:
    """``{2: {host: b, problem: p}, 3: ...}`` -> ``"host b (ranks 2, 3: p)"``, one entry per host."""
    hosts: dict[str, list[int]] = {}
    for rank, report in reports.items():
        hosts.setdefault(report["host"], []).append(rank)
    parts = []
    for host, ranks in hosts.items():
        problem = reports[ranks[0]].get("problem")
        label = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
        parts.append(f"host {host} ({label}{': ' + problem if problem else ''})")
    return " and ".join(parts)
