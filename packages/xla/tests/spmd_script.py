"""Run by test_xla_fsdp_v2.py in a process of its own: SPMD is switched on once per process and XLA's CPU
devices are counted from CPU_NUM_DEVICES when the runtime starts. Prints one JSON line of results."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch_xla
from xla_testing import Regression, loader, weights

from stratagem import Trainer

RUN = {"max_epochs": 2, "logger": False, "enable_progress_bar": False, "enable_checkpointing": False}


def main(workdir: Path) -> None:
    # SPMD first: it must be switched on before the runtime starts, and the first backward of the process (from
    # which autograd sizes its device queues) must see the XLA device (see conftest.py).
    module = Regression()
    trainer = Trainer(strategy="xla_fsdp_v2", devices=2, default_root_dir=workdir / "spmd", **RUN)
    trainer.fit(module, loader(), loader())
    cpu_module = Regression()
    cpu = Trainer(strategy="single_device", accelerator="cpu", default_root_dir=workdir / "cpu", **RUN)
    cpu.fit(cpu_module, loader(), loader())
    path = workdir / "spmd.ckpt"
    trainer.save_checkpoint(path)
    sharding = torch_xla._XLAC._get_xla_sharding_spec(next(trainer.strategy.module.parameters()))
    reloaded = Regression(lr=0.5)
    reloaded_loss = cpu.validate(reloaded, loader(), ckpt_path=path)[0]["val_loss"]
    trained = weights(module)
    difference = max((trained[name] - weights(cpu_module)[name]).abs().max().item() for name in trained)
    print(
        json.dumps(
            {
                "difference": difference,
                "val_loss": float(trainer.callback_metrics["val_loss"]),
                "cpu_val_loss": float(cpu.callback_metrics["val_loss"]),
                "reloaded_loss": reloaded_loss,
                "reloaded_equal": all(torch.equal(weights(reloaded)[name], trained[name]) for name in trained),
                "sharding": sharding,
                "steps": trainer.global_step,
            }
        )
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
