"""Run by test_xla_replicas.py (strategies xla and xla_fsdp) in a fresh process: xmp.spawn refuses to start
replicas once the calling process has started the XLA runtime, which the other tests' process has.
Prints one JSON line of results."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from xla_testing import Regression, loader, weights

from stratagem import Trainer

RUN = {"max_epochs": 2, "logger": False, "enable_progress_bar": False, "enable_checkpointing": False}


class FailsAtStepThree(Regression):
    def training_step(self, batch, batch_idx):
        if batch_idx == 3:
            raise ValueError("replica failure at batch 3")
        return super().training_step(batch, batch_idx)


class FSDPRegression(Regression):
    def configure_optimizers(self):
        # XlaFSDP replaces the module's parameters by its shards: the optimizer steps the wrapped module's.
        return torch.optim.SGD(self.trainer.model.parameters(), lr=self.lr)


def run_xla_fsdp(workdir: Path) -> dict:
    from stratagem_xla.checkpoint_io import XLAShardedCheckpointIO

    from stratagem.checkpoint_io import read_full_checkpoint

    module = FSDPRegression()
    trainer = Trainer(
        strategy="xla_fsdp", devices=1, default_root_dir=workdir / "fsdp", **{**RUN, "enable_checkpointing": True}
    )
    trainer.fit(module, loader(), loader())
    saved = sorted((workdir / "fsdp").rglob("rank-0-of-1.pt"))
    whole = read_full_checkpoint(saved[-1].parent, XLAShardedCheckpointIO())["module"]
    plain = Regression()
    cpu = Trainer(strategy="single_device", accelerator="cpu", default_root_dir=workdir / "fsdp_cpu", **RUN)
    loss = cpu.validate(plain, loader(), ckpt_path=saved[-1].parent)[0]["val_loss"]
    return {
        "fsdp_steps": trainer.global_step,
        "fsdp_val_loss": float(trainer.callback_metrics["val_loss"]),
        "fsdp_consolidated_loss": loss,
        "fsdp_keys": sorted(whole),
        "fsdp_weights": weights(plain),
    }


def main(strategy: str, workdir: Path) -> None:
    module = Regression()
    trainer = Trainer(strategy=strategy, devices=1, default_root_dir=workdir, **RUN)
    trainer.fit(module, loader(), loader())
    try:
        Trainer(strategy=strategy, devices=1, default_root_dir=workdir / "failing", **RUN).fit(
            FailsAtStepThree(), loader()
        )
        failure = None
    except RuntimeError as error:
        failure = str(error)
    cpu_module = Regression()
    fsdp = run_xla_fsdp(workdir)
    cpu = Trainer(strategy="single_device", accelerator="cpu", default_root_dir=workdir / "cpu", **RUN)
    cpu.fit(cpu_module, loader(), loader())
    trained, expected = weights(module), weights(cpu_module)
    fsdp_weights = fsdp.pop("fsdp_weights")
    print(
        json.dumps(
            {
                "difference": max((trained[name] - expected[name]).abs().max().item() for name in trained),
                "steps": trainer.global_step,
                "val_loss": float(trainer.callback_metrics["val_loss"]),
                "weights_on": sorted({value.device.type for value in module.state_dict().values()}),
                "cpu_val_loss": float(cpu.callback_metrics["val_loss"]),
                "failure": failure,
                "torch": torch.__version__,
                "fsdp_difference": max((fsdp_weights[name] - expected[name]).abs().max().item() for name in expected),
                **fsdp,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
