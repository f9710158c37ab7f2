"""The "train 1 trillion+ parameter models" page's DeepSpeed examples, written as a Lightning user writes
them (``accelerator="gpu"`` -> ``"cpu"``, Lightning imports -> stratagem's), run one after another in the
same two processes. Started by the tests as ``python lightning_examples_script.py <root>``; the launcher
re-runs it for rank 1. Rank 0 writes what each example observed to ``<root>/results.json``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import deepspeed
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from stratagem import Module, Trainer
from stratagem.demo import DemoModule, demo_dataloaders
from stratagem_deepspeed import DeepSpeedStrategy

STEPS = 3


class MyModel(Module):
    """A module without configure_optimizers: the DeepSpeed config supplies the optimizer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(8, 4)
        self.learning_rates: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.learning_rates.append(self.trainer.optimizers[0].param_groups[0]["lr"])

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(1)
        data = TensorDataset(torch.randn(64, 8, generator=generator), torch.randn(64, 4, generator=generator))
        return DataLoader(data, batch_size=4)


class ReturnsNone(MyModel):
    def configure_optimizers(self) -> None:
        return None


class ReturnsEmptyLists(MyModel):
    def configure_optimizers(self) -> tuple[list[Any], list[Any]]:
        return [], []


class CheckpointedModel(MyModel):
    """Its forward runs through deepspeed.checkpointing, which reads partition_activations when configured."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(8, 8)
        self.seen: list[bool] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        from deepspeed.runtime.activation_checkpointing import checkpointing

        self.seen.append(checkpointing.is_configured() and checkpointing.PARTITION_ACTIVATIONS)
        x, y = batch
        # Checkpointed blocks take activations (which need gradients), as in the page's transformer example.
        hidden = torch.relu(self.hidden(x))
        return nn.functional.mse_loss(deepspeed.checkpointing.checkpoint(self.layer, hidden), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


PAGE_CONFIG = {
    "zero_allow_untested_optimizer": True,
    "optimizer": {
        "type": "Adam",
        "params": {"lr": 3e-5, "betas": [0.998, 0.999], "eps": 1e-5, "weight_decay": 1e-9},
    },
    "scheduler": {
        "type": "WarmupLR",
        "params": {"last_batch_iteration": -1, "warmup_min_lr": 0, "warmup_max_lr": 3e-5, "warmup_num_steps": 100},
    },
    "zero_optimization": {
        "stage": 2,
        "offload_optimizer": True,
        "contiguous_gradients": True,
        "overlap_comm": True,
        "allgather_bucket_size": 2e8,
        "reduce_bucket_size": 2e8,
    },
}
"""The page's custom config, with 'Adam' for 'OneBitAdam' (which the installed DeepSpeed no longer has)."""

SGD_CONFIG = {
    "zero_allow_untested_optimizer": True,
    "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
    "zero_optimization": {"stage": 2},
}


def trainer(strategy: Any, root: Path, **options: Any) -> Trainer:
    options = {"enable_checkpointing": False, **options}
    return Trainer(
        accelerator="cpu", devices=2, strategy=strategy, max_steps=STEPS, default_root_dir=root, logger=False,
        enable_progress_bar=False, **options,
    )  # fmt: skip


def weights_moved(model: nn.Module, before: dict[str, torch.Tensor]) -> bool:
    return all(not torch.equal(value, before[name]) for name, value in model.state_dict().items())


def fit_from_config(model: MyModel, strategy: Any, root: Path) -> dict[str, Any]:
    before = {name: value.clone() for name, value in model.state_dict().items()}
    fitting = trainer(strategy, root)
    fitting.fit(model)
    return {
        "global_step": fitting.global_step,
        "optimizer": type(fitting.optimizers[0]).__name__,
        "learning_rates": model.learning_rates,
        "weights_moved": weights_moved(model, before),
    }


def main() -> None:
    root = Path(sys.argv[1])
    root.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}

    results["page_dict"] = fit_from_config(MyModel(), DeepSpeedStrategy(config=PAGE_CONFIG), root)

    json_path = root / "ds_config.json"
    json_path.write_text(json.dumps(SGD_CONFIG))
    results["json_path"] = fit_from_config(ReturnsNone(), DeepSpeedStrategy(config=str(json_path)), root)

    os.environ["PL_DEEPSPEED_CONFIG_PATH"] = str(json_path)
    results["environment"] = fit_from_config(ReturnsEmptyLists(), "deepspeed_stage_2", root)
    del os.environ["PL_DEEPSPEED_CONFIG_PATH"]

    checkpointed = CheckpointedModel()
    trainer(DeepSpeedStrategy(stage=3, partition_activations=True), root).fit(checkpointed)
    results["partition_activations"] = checkpointed.seen

    sequence = trainer("deepspeed_stage_3", root / "sequence", num_sanity_val_steps=0, enable_checkpointing=True)
    train, val = demo_dataloaders(batch_size=8, num_samples=64)
    module = DemoModule(hidden=8)
    sequence.fit(module, train)
    assert sequence.checkpoint_callback is not None
    loaded = DemoModule.load_from_checkpoint(sequence.checkpoint_callback.best_model_path, hidden=8)
    results["load_from_checkpoint"] = all(
        torch.equal(value, module.state_dict()[name]) for name, value in loaded.state_dict().items()
    )
    results["sequence"] = {
        "test": sequence.test(module, val),
        "validate": sequence.validate(module, val),
        "predictions": len(sequence.predict(module, val) or []),
        "shapes": {name: list(value.shape) for name, value in module.state_dict().items()},
    }
    if sequence.is_global_zero:
        (root / "results.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
