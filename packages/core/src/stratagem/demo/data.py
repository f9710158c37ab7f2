"""Synthetic data for the demo, generated in memory from a fixed seed: nothing is downloaded."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

NUM_FEATURES = 32
NUM_CLASSES = 4


def make_classification(num_samples: int, seed: int = 1234) -> TensorDataset:
    """Points labelled by a fixed random two-layer "teacher" network: learnable, but not linearly."""
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(num_samples, NUM_FEATURES, generator=generator)
    hidden = torch.randn(NUM_FEATURES, 16, generator=generator) / NUM_FEATURES**0.5
    readout = torch.randn(16, NUM_CLASSES, generator=generator)
    labels = (torch.tanh(features @ hidden) @ readout).argmax(dim=1)
    return TensorDataset(features, labels)


def demo_dataloaders(batch_size: int = 64, num_samples: int = 16384) -> tuple[DataLoader, DataLoader]:
    """Training (shuffled) and validation loaders over one synthetic dataset (7/8 and 1/8 of it)."""
    dataset = make_classification(num_samples)
    split = num_samples * 7 // 8
    features, labels = dataset.tensors
    train = TensorDataset(features[:split], labels[:split])
    val = TensorDataset(features[split:], labels[split:])
    return DataLoader(train, batch_size=batch_size, shuffle=True), DataLoader(val, batch_size=batch_size * 2)
