"""Every rank of one benchmark contender started as a fresh process of ``run.py <benchmark> --worker``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stratagem.environments.local import find_free_port

BENCH_DIR = Path(__file__).resolve().parent


def run_ranks(
    benchmark: str,
    spec: Mapping[str, Any],
    world_size: int,
    *,
    env: Mapping[str, str] | None = None,
    set_rank: bool = False,
    drop_env_prefixes: tuple[str, ...] = (),
    timeout_s: float = 1800,
) -> list[dict[str, Any]]:
    """Run ``world_size`` ranks of ``benchmark``'s worker on ``spec`` and return what each wrote, by rank.

    Each worker gets ``spec`` with ``"out"`` (the JSON file it writes its report to) added, and the
    rendezvous variables of a single-node job. ``env`` is added on top of this process's environment, less
    the variables starting with any of ``drop_env_prefixes`` (a contender's allocator settings, say, that
    must not reach another). ``set_rank`` also sets ``RANK``, for workers that read it rather than
    ``LOCAL_RANK``. A rank exiting non-zero raises, after every rank has ended.
    """
    inherited = {key: value for key, value in os.environ.items() if not key.startswith(drop_env_prefixes)}
    with tempfile.TemporaryDirectory() as directory:
        port = find_free_port()
        processes = []
        for rank in range(world_size):
            out = Path(directory) / f"rank{rank}.json"
            rank_env = {
                **inherited,
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
                **({"RANK": str(rank)} if set_rank else {}),
                **(env or {}),
            }
            command = [
                sys.executable,
                str(BENCH_DIR / "run.py"),
                benchmark,
                "--worker",
                json.dumps({**spec, "out": str(out)}),
            ]
            processes.append((subprocess.Popen(command, env=rank_env), out))
        failed = [rank for rank, (process, _) in enumerate(processes) if process.wait(timeout=timeout_s) != 0]
        if failed:
            raise RuntimeError(f"{benchmark} {dict(spec)}: rank(s) {failed} failed (see their output above)")
        return [json.loads(out.read_text()) for _, out in processes]
