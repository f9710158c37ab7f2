"""Gradient accumulation for a pipeline: the training data read in windows of ``accumulate_grad_batches``
batches, each window one call of the schedule over all its batches' micro-batches."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any


class BatchWindows:
    """``loader``'s batches in lists of ``size`` (the last one shorter where the loader's length does not
    divide), with the loader's length in windows and its samplers, which the Trainer tells each epoch."""

    def __init__(self, loader: Iterable[Any], size: int) -> None:
        self.loader = loader
        self.size = size

    def __iter__(self) -> Iterator[list[Any]]:
        window: list[Any] = []
        for batch in self.loader:
            window.append(batch)
            if len(window) == self.size:
                yield window
                window = []
        if window:
            yield window

    def __len__(self) -> int:
        return math.ceil(len(self.loader) / self.size)  # type: ignore[arg-type]

    @property
    def sampler(self) -> Any:
        return getattr(self.loader, "sampler", None)

    @property
    def batch_sampler(self) -> Any:
        return getattr(self.loader, "batch_sampler", None)
