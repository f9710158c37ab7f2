"""``poptorch.DataLoader``: each batch it yields is the combined batch of one executor call."""

from __future__ import annotations

import enum
from typing import Any

import torch.utils.data

from poptorch._options import Options


class DataLoaderMode(enum.Enum):
    Sync = 0
    Async = 1
    AsyncRebatched = 2


class DataLoader(torch.utils.data.DataLoader):
    """``batch_size`` is the micro-batch; a yielded batch holds
    ``batch_size x device_iterations x replication_factor x gradient_accumulation`` samples."""

    def __init__(
        self,
        options: Options,
        dataset: Any,
        batch_size: int = 1,
        shuffle: bool = False,
        num_workers: int = 0,
        drop_last: bool = True,
        persistent_workers: bool | None = None,
        auto_distributed_partitioning: bool = True,
        mode: DataLoaderMode = DataLoaderMode.Sync,
        **kwargs: Any,
    ) -> None:
        if not isinstance(options, Options):
            raise TypeError(f"poptorch.DataLoader: options must be poptorch.Options, got {type(options).__name__}")
        self.options = options
        self.micro_batch_size = batch_size
        self.combinedBatchSize = (
            batch_size * options.device_iterations * options.replication_factor * options.Training.gradient_accumulation
        )
        super().__init__(
            dataset,
            batch_size=self.combinedBatchSize,
            shuffle=shuffle,
            num_workers=num_workers,
            drop_last=drop_last,
            persistent_workers=bool(persistent_workers) and num_workers > 0,
            **kwargs,
        )
