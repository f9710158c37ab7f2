"""Dataloaders for a run: splitting data across ranks and counting batches.

When the strategy splits data (``strategy.distributed_sampler_kwargs`` is not ``None``) a
user's DataLoader is re-created around a DistributedSampler, with every other setting kept
(workers, collate_fn, pin_memory, drop_last, generator, ...).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)

_KEPT_SETTINGS = (
    "batch_size",
    "num_workers",
    "collate_fn",
    "pin_memory",
    "drop_last",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "generator",
    "prefetch_factor",
    "persistent_workers",
    "pin_memory_device",
    "in_order",
)


def as_loader_list(loaders: Any, argument: str) -> list[Iterable[Any]]:
    """The dataloaders given as ``argument``, as a list.

    A list or tuple of DataLoaders means several; any other iterable (a list of batches
    included) is one source of batches.
    """
    if loaders is None:
        return []
    several = isinstance(loaders, list | tuple) and loaders and all(isinstance(item, DataLoader) for item in loaders)
    items = list(loaders) if several else [loaders]
    for item in items:
        if not isinstance(item, Iterable):
            raise TypeError(
                f"{argument} got {type(item).__name__}; expected a DataLoader, any iterable of batches, or a list "
                "of DataLoaders."
            )
    return items


def check_splittable(loader: Iterable[Any], argument: str) -> None:
    """Raise, in the calling process, if ``loader`` cannot be re-created with a DistributedSampler."""
    if not _needs_sampler(loader):
        return
    assert isinstance(loader, DataLoader)
    if not isinstance(loader.sampler, RandomSampler | SequentialSampler) or type(loader.batch_sampler) is not (
        BatchSampler
    ):
        raise ValueError(
            f"{argument}: the DataLoader uses a custom sampler ({type(loader.sampler).__name__}, batch sampler "
            f"{type(loader.batch_sampler).__name__}) that cannot be split across ranks automatically. Give it a "
            "DistributedSampler yourself, or pass use_distributed_sampler=False to the Trainer if each rank "
            "should see it whole."
        )


def with_distributed_sampler(
    loader: Iterable[Any], sampler_kwargs: dict[str, int] | None, seed: int, shuffle: bool | None = None
) -> Iterable[Any]:
    """``loader`` re-created to read only this rank's share, or ``loader`` itself when nothing to do.

    ``shuffle=None`` keeps the user's choice (a RandomSampler means shuffle).
    """
    if sampler_kwargs is None or not _needs_sampler(loader):
        return loader
    assert isinstance(loader, DataLoader)
    check_splittable(loader, "dataloader")
    if shuffle is None:
        shuffle = isinstance(loader.sampler, RandomSampler)
    sampler: DistributedSampler[Any] = DistributedSampler(
        loader.dataset,
        num_replicas=sampler_kwargs["num_replicas"],
        rank=sampler_kwargs["rank"],
        shuffle=shuffle,
        seed=seed,
    )
    settings = {name: getattr(loader, name) for name in _KEPT_SETTINGS if hasattr(loader, name)}
    try:
        return type(loader)(loader.dataset, sampler=sampler, **settings)
    except TypeError as error:
        raise ValueError(
            f"Could not re-create {type(loader).__name__} with a DistributedSampler ({error}). Build it with a "
            "DistributedSampler yourself and pass use_distributed_sampler=False to the Trainer."
        ) from None


def set_epoch(loader: Iterable[Any], epoch: int) -> None:
    """Tell epoch-aware samplers (DistributedSampler) which epoch starts, so shuffling changes per epoch."""
    for owner in (getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None)):
        set_epoch_fn = getattr(owner, "set_epoch", None)
        if callable(set_epoch_fn):
            set_epoch_fn(epoch)


def count_batches(loader: Iterable[Any], limit: int | float, argument: str) -> int | None:
    """How many batches a pass reads: the loader's length cut by ``limit`` (a count or a fraction).

    ``None`` when the loader has no length and the whole of it is read.
    """
    try:
        length: int | None = len(loader)  # type: ignore[arg-type]
    except TypeError:
        length = None
    if isinstance(limit, int):
        return limit if length is None else min(length, limit)
    if length is None:
        if limit == 1.0:
            return None
        raise ValueError(
            f"{argument}={limit} is a fraction of the data, but the dataloader has no length; pass a number of "
            "batches (an int) instead."
        )
    return max(1, int(length * limit)) if limit > 0 else 0


def limited(loader: Iterable[Any], count: int | None) -> Iterator[Any]:
    """Iterate at most ``count`` batches of ``loader`` (all when ``None``)."""
    iterator = iter(loader)
    return iterator if count is None else islice(iterator, count)


def _needs_sampler(loader: Iterable[Any]) -> bool:
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return False
    return not isinstance(loader.sampler, DistributedSampler) and not isinstance(
        getattr(loader.batch_sampler, "sampler", None), DistributedSampler
    )
