"""Scale: the largest decoder each strategy trains for 3 steps on 2 processes inside a memory cap.

    python tools/bench/run.py scale probe --strategy deepspeed_stage_3 --width 1024 --layers 16 [--cap-gib 10]
    python tools/bench/run.py scale search --strategies ddp,deepspeed_stage_3 --width 1024 [--cap-gib 10]

A probe creates a memory cgroup (v2 ``memory.max``, or v1 ``memory.limit_in_bytes`` where the memory
controller is on v1) holding at most ``--cap-gib``, starts the training script in it under ``nice -n 10``
(so running out of memory kills the probe and nothing else on the machine), and then, in the same cap,
validates the checkpoint it saved under ``--validate-with``. The model is a decoder (token embedding tied
to the output, pre-norm causal self-attention blocks with a 4x MLP), built in ``configure_model`` so that
no process ever creates it whole when the strategy shards (FSDP units, DeepSpeed ``zero.Init``); AdamW,
fp32. A probe passes when 3 optimizer steps give a finite loss, the checkpoint is saved, and the validation
loss under the other strategy is finite. It prints parameters, peak RSS per rank, the cap's peak, the disk the
checkpoint takes, seconds per step, and the planner's estimate per rank beside the measured peak.
``search`` doubles the layer count from ``--layers`` until a probe fails, then bisects once.

Needs root (to create the cgroup). Not part of CI: a probe of a large model takes minutes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional

import stratagem
import stratagem.callbacks

SEQUENCE = 32
VOCAB = 8192
BATCH = 1
RUN_PY = Path(__file__).resolve().parent / "run.py"
NVME_PATH = "/tmp/scale-nvme"


class Decoder(stratagem.Module):
    """A GPT-style decoder built in ``configure_model``; ``example_input_array`` lets the planner size activations."""

    def __init__(self, width: int, layers: int, heads: int = 16) -> None:
        super().__init__()
        self.width, self.layers, self.heads = width, layers, heads
        self.embedding: nn.Embedding | None = None
        self.blocks: nn.ModuleList | None = None
        self.norm: nn.LayerNorm | None = None
        self.example_input_array = torch.zeros(BATCH, SEQUENCE, dtype=torch.long)

    def configure_model(self) -> None:
        if self.blocks is not None:
            return
        self.embedding = nn.Embedding(VOCAB, self.width)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(
                self.width, self.heads, 4 * self.width, dropout=0.0, batch_first=True, norm_first=True
            )
            for _ in range(self.layers)
        )
        self.norm = nn.LayerNorm(self.width)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        assert self.embedding is not None
        assert self.blocks is not None
        assert self.norm is not None
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], dtype=self.embedding.weight.dtype)
        hidden = self.embedding(tokens)
        for block in self.blocks:
            hidden = block(hidden, src_mask=mask, is_causal=True)
        return self.norm(hidden) @ self.embedding.weight.t()

    def _loss(self, batch: Any) -> torch.Tensor:
        (tokens,) = batch
        logits = self(tokens[:, :-1])
        return functional.cross_entropy(logits.reshape(-1, VOCAB).float(), tokens[:, 1:].reshape(-1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self._loss(batch), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


def parameters_of(width: int, layers: int) -> int:
    per_block = 12 * width * width + 13 * width
    return VOCAB * width + layers * per_block + 2 * width


def _data() -> list[tuple[torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    return [(torch.randint(0, VOCAB, (BATCH, SEQUENCE + 1), generator=generator),) for _ in range(8)]


class _Record(stratagem.callbacks.Callback):
    """Saves the checkpoint at the end of training (sharded strategies save only while the run is live) and
    times the steps."""

    def __init__(self, checkpoint: str) -> None:
        self.checkpoint = checkpoint
        self.step_ends: list[float] = []

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.step_ends.append(time.perf_counter())

    def on_train_end(self, trainer: Any, module: Any) -> None:
        trainer.save_checkpoint(self.checkpoint)


def _strategy(name: str, nvme_path: str = NVME_PATH) -> Any:
    """Names as registered, except that fsdp gets one unit per decoder block (its default shards only the root)
    and NVMe offload swaps to ``nvme_path``."""
    if name.startswith("fsdp"):
        from stratagem_fsdp import FSDPStrategy

        return FSDPStrategy(auto_wrap_policy={nn.TransformerEncoderLayer}, cpu_offload=name == "fsdp_cpu_offload")
    if name.endswith("_nvme"):
        from stratagem_deepspeed import DeepSpeedStrategy
        from stratagem_deepspeed.registration import STRATEGY_ALIASES

        return DeepSpeedStrategy(**STRATEGY_ALIASES[name][0], nvme_path=nvme_path)
    return name


def _worker(args: argparse.Namespace) -> int:
    """Runs in every rank (the launcher re-executes this command line)."""
    out = Path(args.out)
    module = Decoder(args.width, args.layers)
    common = {
        "accelerator": "cpu",
        "devices": 2,
        "logger": False,
        "enable_progress_bar": False,
        "precision": args.precision,
    }
    if args.stage == "fit":
        record = _Record(str(out / "checkpoint"))
        trainer = stratagem.Trainer(
            strategy=_strategy(args.strategy, args.nvme_path),
            max_steps=3,
            enable_checkpointing=False,
            num_sanity_val_steps=0,
            callbacks=[record],
            **common,
        )
        trainer.fit(module, _data())
        loss = float(trainer.callback_metrics["loss"])
        steps = [later - earlier for earlier, later in zip(record.step_ends, record.step_ends[1:])]
        result = {"loss": loss, "seconds_per_step": sum(steps) / len(steps) if steps else math.nan}
    else:
        trainer = stratagem.Trainer(
            strategy=_strategy(args.strategy, args.nvme_path), enable_checkpointing=False, **common
        )
        [metrics] = trainer.validate(module, _data()[:2], ckpt_path=str(out / "checkpoint"))
        result = {"loss": metrics["val_loss"]}
    result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    (out / f"{args.stage}.rank{trainer.global_rank}.json").write_text(json.dumps(result))
    return 0


# -- the cap -------------------------------------------------------------------------------------


class MemoryCap:
    """A memory cgroup for one probe: v2 where the memory controller is on the unified hierarchy, else v1."""

    def __init__(self, name: str, limit: int) -> None:
        unified = Path("/sys/fs/cgroup")
        if (unified / "cgroup.controllers").exists() and "memory" in (unified / "cgroup.controllers").read_text():
            self.path, self.files = unified / name, ("memory.max", "memory.peak")
        else:
            self.path, self.files = unified / "memory" / name, ("memory.limit_in_bytes", "memory.max_usage_in_bytes")
        self.path.mkdir(exist_ok=True)
        (self.path / self.files[0]).write_text(str(limit))

    def enter(self) -> None:
        """Move the calling process (and so every child it starts) into the cap."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def peak(self) -> int:
        try:
            return int((self.path / self.files[1]).read_text())
        except (OSError, ValueError):
            return 0

    def reset_peak(self) -> None:
        if self.files[1] == "memory.max_usage_in_bytes":
            (self.path / self.files[1]).write_text("0")

    def remove(self) -> None:
        try:
            self.path.rmdir()
        except OSError:
            pass


def _disk_bytes(directories: list[Path]) -> int:
    """Blocks allocated under ``directories`` (swap files may be sparse), in bytes."""
    total = 0
    for directory in directories:
        for path in directory.rglob("*") if directory.is_dir() else ():
            try:
                total += path.lstat().st_blocks * 512 if path.is_file() else 0
            except OSError:
                pass
    return total


class DiskPeak:
    """The largest disk use seen under some directories, sampled every second while a probe runs."""

    def __init__(self, directories: list[Path]) -> None:
        self.directories, self.peak = directories, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(1.0):
            self.peak = max(self.peak, _disk_bytes(self.directories))

    def __enter__(self) -> DiskPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _disk_bytes(self.directories))


def _run_capped(cap: MemoryCap, argv: list[str], timeout: float) -> tuple[int, float, str]:
    """Exit code, seconds and what ``strategy="auto"`` said it chose (empty when it said nothing)."""
    start = time.perf_counter()
    environment = {**os.environ, "MALLOC_ARENA_MAX": "2", "DS_ACCELERATOR": "cpu"}
    try:
        completed = subprocess.run(
            ["nice", "-n", "10", sys.executable, str(RUN_PY), "scale", *argv],
            preexec_fn=cap.enter,
            env=environment,
            timeout=timeout,
            capture_output=True,
            text=True,
        )
        code = completed.returncode
        stderr = completed.stderr
        if code != 0:
            sys.stderr.write(stderr[-3000:])
    except subprocess.TimeoutExpired:
        code, stderr = -1, ""
    chosen = [line for line in stderr.splitlines() if line.startswith("stratagem: auto")]
    return code, time.perf_counter() - start, chosen[0].removeprefix("stratagem: ") if chosen else ""


def _planned(strategy: str, width: int, layers: int, precision: str, nvme_path: str) -> Any:
    from stratagem.planning import plan

    planned = plan(
        Decoder(width, layers), [_strategy(strategy, nvme_path)], accelerator="cpu", devices=2, precision=precision
    )
    return planned.candidates[0]


def probe(
    strategy: str,
    width: int,
    layers: int,
    cap_gib: float,
    validate_with: str,
    timeout: float,
    precision: str = "32-true",
    nvme_path: str = NVME_PATH,
) -> dict[str, Any]:
    parameters = parameters_of(width, layers)
    candidate = _planned(strategy, width, layers, precision, nvme_path)
    out = Path(tempfile.mkdtemp(prefix="stratagem_scale_"))
    cap = MemoryCap(f"stratagem_scale_{os.getpid()}", int(cap_gib * 1024**3))
    result: dict[str, Any] = {
        "strategy": strategy,
        "width": width,
        "layers": layers,
        "parameters": parameters,
        "cap_gib": cap_gib,
        "precision": precision,
        "estimate_per_rank_bytes": candidate.memory_per_rank,
        "estimate_disk_bytes": candidate.estimate.disk_bytes * 2 if candidate.estimate else 0,
    }
    swap = Path(nvme_path)
    try:
        shape = ["--width", str(width), "--layers", str(layers), "--out", str(out), "--precision", precision]
        shape += ["--nvme-path", nvme_path]
        with DiskPeak([out, swap]) as disk:
            code, seconds, chosen = _run_capped(cap, ["_worker", "fit", "--strategy", strategy, *shape], timeout)
        fit = [json.loads(path.read_text()) for path in sorted(out.glob("fit.rank*.json"))]
        result.update(
            fit_exit=code, fit_seconds=round(seconds, 1), cap_peak_bytes=cap.peak(), disk_peak_bytes=disk.peak
        )
        if chosen:
            result["auto"] = chosen
            # The estimate to compare with the run is the one of the strategy auto chose.
            picked = _planned(chosen.split("→")[1].split(":")[0].strip(), width, layers, precision, nvme_path)
            result["estimate_per_rank_bytes"] = picked.memory_per_rank
        if code != 0 or len(fit) != 2:
            result["passed"] = False
            result["failure"] = "out of memory (killed in the cap)" if code in (-9, 137) else f"exit {code}"
            return result
        result["loss"] = fit[0]["loss"]
        result["seconds_per_step"] = fit[0]["seconds_per_step"]
        result["peak_rss_per_rank_bytes"] = [rank["peak_rss_bytes"] for rank in fit]
        result["checkpoint_bytes"] = (
            sum(path.stat().st_size for path in (out / "checkpoint").rglob("*") if path.is_file())
            if (out / "checkpoint").is_dir()
            else (out / "checkpoint").stat().st_size
        )
        cap.reset_peak()
        code, seconds, _ = _run_capped(cap, ["_worker", "validate", "--strategy", validate_with, *shape], timeout)
        validated = [json.loads(path.read_text()) for path in sorted(out.glob("validate.rank*.json"))]
        result.update(validate_with=validate_with, validate_exit=code)
        result["val_loss"] = validated[0]["loss"] if validated else None
        result["validate_peak_rss_per_rank_bytes"] = [rank["peak_rss_bytes"] for rank in validated]
        result["passed"] = (
            code == 0
            and math.isfinite(result["loss"])
            and result["val_loss"] is not None
            and math.isfinite(result["val_loss"])
        )
        if not result["passed"]:
            result["failure"] = f"validation under {validate_with}: exit {code}"
        return result
    finally:
        cap.remove()
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(swap / "zero_stage_3", ignore_errors=True)


def _print(result: dict[str, Any]) -> None:
    gib = 1024**3
    peaks = result.get("peak_rss_per_rank_bytes") or []
    measured = max(peaks) if peaks else 0
    validating = result.get("validate_peak_rss_per_rank_bytes") or []
    estimate = result["estimate_per_rank_bytes"]
    error = f"{(estimate - measured) / measured:+.0%}" if measured else "-"
    print(
        f"{result['strategy']:<28} {result['parameters'] / 1e6:8.1f}M  "
        f"{'PASS' if result.get('passed') else 'FAIL':4}  "
        f"rss/rank {' '.join(f'{peak / gib:.2f}' for peak in peaks) or '-':>11} GiB  "
        f"validating {' '.join(f'{peak / gib:.2f}' for peak in validating) or '-':>11} GiB  "
        f"cap peak {result.get('cap_peak_bytes', 0) / gib:5.2f} GiB  "
        f"checkpoint {result.get('checkpoint_bytes', 0) / gib:5.2f} GiB  "
        f"disk peak {result.get('disk_peak_bytes', 0) / gib:5.2f} GiB  "
        f"{result.get('seconds_per_step', math.nan):6.1f} s/step  "
        f"estimate/rank {estimate / gib:5.2f} GiB ({error})  {result.get('failure', '')}  {result.get('auto', '')}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="run.py scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["probe", "search", "_worker"])
    parser.add_argument("stage", nargs="?", choices=["fit", "validate"], help=argparse.SUPPRESS)
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--strategies", default="ddp,deepspeed_stage_3")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--cap-gib", type=float, default=10.0)
    parser.add_argument("--precision", default="32-true", help="the Trainer's precision, e.g. bf16-mixed")
    parser.add_argument("--nvme-path", default=NVME_PATH, help="where NVMe offload swaps (emptied after each probe)")
    parser.add_argument("--validate-with", default=None, help="default: fsdp, or ddp for fsdp strategies")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds per probe stage")
    parser.add_argument("--json", default=None, help="append every probe's result to this JSON-lines file")
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.mode == "_worker":
        return _worker(args)

    def run_one(strategy: str, layers: int) -> dict[str, Any]:
        validate_with = args.validate_with or ("ddp" if strategy.startswith("fsdp") else "fsdp")
        result = probe(
            strategy, args.width, layers, args.cap_gib, validate_with, args.timeout, args.precision, args.nvme_path
        )
        _print(result)
        if args.json:
            with open(args.json, "a") as stream:
                stream.write(json.dumps(result) + "\n")
        return result

    print(
        f"cap {args.cap_gib} GiB per probe (both ranks together), nice 10, width {args.width}, seq {SEQUENCE}, "
        f"precision {args.precision}"
    )
    if args.mode == "probe":
        return 0 if run_one(args.strategy, args.layers).get("passed") else 1
    for strategy in args.strategies.split(","):
        passed, failed = 0, None
        layers = args.layers
        while failed is None:
            if run_one(strategy, layers).get("passed"):
                passed, layers = layers, layers * 2
            else:
                failed = layers
        if passed and failed - passed > 1:
            run_one(strategy, (passed + failed) // 2)
    return 0
