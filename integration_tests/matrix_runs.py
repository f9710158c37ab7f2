"""What one rank does in the checkpoint matrix: fit, test and predict under a strategy; validate a checkpoint.

Module-level functions, so that a :class:`stratagem.testing.DistributedWorkers` pool (whose ranks
look like torchrun's to stratagem) or the test process itself can run them. Every strategy joins
the ranks the pool started instead of starting its own, so one pair of processes serves the
whole matrix.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional
from torch.utils.data import DataLoader, TensorDataset

import stratagem
from stratagem import registry
from stratagem.callbacks import ModelCheckpoint

SAMPLES = 64
BATCH_SIZE = 8
FIT_STEPS = 3


class MatrixModule(stratagem.Module):
    """Two linear layers with Adam, so that a checkpoint carries optimizer state worth moving; as a list of two
    blocks with ``pipeline_loss``, so that the pipeline strategy can cut it into two stages."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList([nn.Sequential(nn.Linear(8, 32), nn.ReLU()), nn.Linear(32, 2)])

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            features = layer(features)
        return features

    def pipeline_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return functional.cross_entropy(logits, labels)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        features, labels = batch
        return self.pipeline_loss(self(features), labels)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        features, labels = batch
        self.log("val_loss", functional.cross_entropy(self(features).float(), labels), sync_dist=True)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        features, labels = batch
        self.log("test_loss", functional.cross_entropy(self(features).float(), labels), sync_dist=True)

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(batch[0]).float().argmax(1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        # Adam's default eps (1e-8) is 0 in float16, where 16-true keeps the optimizer state.
        eps = max(1e-8, torch.finfo(next(self.parameters()).dtype).tiny)
        return torch.optim.Adam(self.parameters(), lr=0.05, eps=eps)


def loader(seed: int) -> DataLoader:
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(SAMPLES, 8, generator=generator)
    labels = (features[:, 0] - features[:, 3] > 0).long()
    return DataLoader(TensorDataset(features, labels), batch_size=BATCH_SIZE)


# Elements per NVMe swap buffer: the matrix's model is tiny, and DeepSpeed's default (1e8, five buffers)
# page-locks 2 GiB of host memory per rank, which takes seconds to lock and free on every run.
_NVME_SWAP_BUFFER_ELEMENTS = 1_000_000


def _strategy(name: str, scratch: Path) -> stratagem.strategies.Strategy:
    """The registered strategy, given a scratch directory where it takes one (NVMe offload swaps there)."""
    accepted = inspect.signature(registry.strategies.load_target(name)).parameters
    options: dict[str, Any] = {"nvme_path": str(scratch)} if "nvme_path" in accepted else {}
    if registry.strategies.get(name).defaults.get("offload_params_device") == "nvme":
        options["params_buffer_size"] = _NVME_SWAP_BUFFER_ELEMENTS
    return registry.strategies.create(name, **options)


def _trainer(
    strategy: str, accelerator: str, devices: int, precision: str, root: Path, **options: Any
) -> stratagem.Trainer:
    return stratagem.Trainer(
        strategy=_strategy(strategy, root / "scratch"),
        accelerator=accelerator,
        devices=devices,
        precision=precision,
        default_root_dir=root,
        logger=False,
        enable_progress_bar=False,
        num_sanity_val_steps=0,
        seed=0,
        **options,
    )


def fit_test_predict(strategy: str, accelerator: str, devices: int, precision: str, root: str) -> dict[str, Any]:
    """Fit briefly and save at the end, then validate, test and predict with the same Trainer and module."""
    directory = Path(root)
    checkpoint = ModelCheckpoint(dirpath=directory / "checkpoints", filename="final")
    trainer = _trainer(
        strategy, accelerator, devices, precision, directory, max_steps=FIT_STEPS, callbacks=[checkpoint]
    )
    module = MatrixModule()
    trainer.fit(module, loader(0))
    [validated] = trainer.validate(module, loader(1))
    [tested] = trainer.test(module, loader(2))
    predictions = trainer.predict(module, loader(3))
    return {
        "checkpoint": checkpoint.last_model_path or checkpoint.best_model_path,
        "global_step": trainer.global_step,
        "val_loss": float(validated["val_loss"]),
        "test_loss": float(tested["test_loss"]),
        "predicted_batches": len(predictions),
        # Ranks that split one model (tensor parallelism) predict the same batches: the data splits over fewer.
        "data_parallel_size": (trainer.strategy.distributed_sampler_kwargs or {}).get("num_replicas"),
        "predictions_finite": all(torch.isfinite(torch.as_tensor(batch).float()).all() for batch in predictions),
    }


def validate_checkpoints(
    strategy: str, accelerator: str, devices: int, checkpoints: dict[str, str], root: str
) -> dict[str, Any]:
    """``validate(ckpt_path=...)`` of each checkpoint under ``strategy`` at fp32: its loss, or the error."""
    results: dict[str, Any] = {}
    for source, path in checkpoints.items():
        try:
            trainer = _trainer(
                strategy, accelerator, devices, "32-true", Path(root) / source, enable_checkpointing=False
            )
            [validated] = trainer.validate(MatrixModule(), loader(1), ckpt_path=path)
            results[source] = float(validated["val_loss"])
        except Exception as error:
            results[source] = f"{type(error).__name__}: {error}"
    return results
