"""A GAN-style module with two optimizers and manual optimization, fitted and resumed under one strategy.

Module-level so that a pair of worker processes can run it; the test compares every strategy with
single_device on the same global batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn import functional
from torch.utils.data import DataLoader, TensorDataset

import stratagem
from stratagem.callbacks import ModelCheckpoint, ThroughputMonitor

GLOBAL_BATCH = 8
BATCHES = 6
STEPS = 2 * BATCHES  # both optimizers step on every batch: each step counts, as in Lightning
RESUME_FROM_STEP = 6  # after batch 3 of 6: in the middle of the epoch
SEED = 0


class TinyGAN(stratagem.Module):
    """Generator and discriminator stepped one after the other in training_step, each toggled for its backward."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 2))
        self.discriminator = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1))
        self.losses: list[tuple[float, float]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        real, noise = batch
        generator_optimizer, discriminator_optimizer = self.optimizers()
        ones = torch.ones(real.shape[0], 1)
        zeros = torch.zeros(real.shape[0], 1)

        with self.toggled_optimizer(generator_optimizer):
            fooled = self.discriminator(self.generator(noise))
            generator_loss = functional.binary_cross_entropy_with_logits(fooled, ones)
            self.manual_backward(generator_loss)
            generator_optimizer.step()
            generator_optimizer.zero_grad()

        with self.toggled_optimizer(discriminator_optimizer):
            fake = self.generator(noise).detach()
            discriminator_loss = (
                functional.binary_cross_entropy_with_logits(self.discriminator(real), ones)
                + functional.binary_cross_entropy_with_logits(self.discriminator(fake), zeros)
            ) / 2
            self.manual_backward(discriminator_loss)
            discriminator_optimizer.step()
            discriminator_optimizer.zero_grad()

        for scheduler in self.lr_schedulers():
            scheduler.step()
        self.losses.append((generator_loss.item(), discriminator_loss.item()))
        return discriminator_loss

    def configure_optimizers(self) -> Any:
        generator = torch.optim.Adam(self.generator.parameters(), lr=0.01, betas=(0.5, 0.9))
        discriminator = torch.optim.Adam(self.discriminator.parameters(), lr=0.01, betas=(0.5, 0.9))
        schedulers = [
            torch.optim.lr_scheduler.StepLR(each, step_size=2, gamma=0.8) for each in (generator, discriminator)
        ]
        return [generator, discriminator], schedulers


def gan_loader(world: int) -> DataLoader:
    """Real points on a ring and the generator's noise, in the batch so that every strategy sees the same."""
    generator = torch.Generator().manual_seed(1)
    angles = torch.rand(BATCHES * GLOBAL_BATCH, generator=generator) * 6.283
    real = torch.stack([angles.cos(), angles.sin()], dim=1)
    noise = torch.randn(BATCHES * GLOBAL_BATCH, 2, generator=generator)
    return DataLoader(TensorDataset(real, noise), batch_size=GLOBAL_BATCH // world)


def _trainer(strategy: str, devices: int, root: Path, **options: Any) -> stratagem.Trainer:
    return stratagem.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=devices,
        default_root_dir=root,
        logger=False,
        enable_progress_bar=False,
        num_sanity_val_steps=0,
        seed=SEED,
        max_steps=STEPS,
        **options,
    )


def _full_weights(module: nn.Module) -> dict[str, torch.Tensor]:
    weights = {}
    for name, value in module.state_dict().items():
        if isinstance(value, DTensor):
            value = value.full_tensor()
        weights[name] = value.detach().clone()
    return weights


def fit_and_resume(strategy: str, devices: int, root: str) -> dict[str, Any]:
    """Fit ``STEPS`` steps saving at ``RESUME_FROM_STEP``, then fit again resumed from there; each run's final
    weights, the first run's losses per batch (this rank's half of the batch), its throughput figures and each
    rank's peak memory."""
    directory = Path(root)
    checkpoints = ModelCheckpoint(
        dirpath=directory / "checkpoints", filename="{step}", every_n_train_steps=RESUME_FROM_STEP, save_top_k=-1
    )
    monitor = ThroughputMonitor()
    trainer = _trainer(strategy, devices, directory, callbacks=[checkpoints, monitor])
    module = TinyGAN()
    trainer.fit(module, gan_loader(devices))
    middle = next(
        path for path in (directory / "checkpoints").iterdir() if path.name.startswith(f"step={RESUME_FROM_STEP}")
    )
    resumed_trainer = _trainer(strategy, devices, directory / "resumed", enable_checkpointing=False)
    resumed = TinyGAN()
    resumed_trainer.fit(resumed, gan_loader(devices), ckpt_path=str(middle))
    return {
        "global_step": trainer.global_step,
        "resumed_global_step": resumed_trainer.global_step,
        "losses": module.losses,
        "figures": monitor.run_figures,
        "peak_memory_bytes": trainer.throughput.peak_memory_bytes,
        "weights": _full_weights(module),
        "resumed_weights": _full_weights(resumed),
    }
