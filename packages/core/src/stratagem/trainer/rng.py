"""Random-number-generator state: seeding, saving in checkpoints, and isolating evaluation.

States are kept as tensors, ints and tuples so that checkpoints load with ``weights_only=True``.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import os
import random
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

SEED_WORKERS_VARIABLE = "STRATAGEM_SEED_WORKERS"
"""Set by :func:`seed_everything`; an environment variable so that every process a launcher starts inherits it."""


def seed_everything(seed: int, workers: bool = False) -> int:
    """Seed Python's, torch's (all devices) and, when it is loaded, numpy's global generators; return ``seed``.

    ``workers=True`` also seeds each DataLoader worker process of the loaders a Trainer runs: Python's, numpy's
    and torch's generators get a seed derived from the loader's base seed for that epoch, the worker's index and
    the global rank, so no two workers (of any rank) draw the same augmentations and a rerun draws them again.
    A loader's own ``worker_init_fn`` still runs, after that seeding. ``workers=False`` leaves workers to torch's
    defaults (numpy's generator is then the same copy in every worker).
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise ValueError(f"seed_everything(seed={seed!r}) is not valid; expected an int in [0, 2**63 - 1].")
    if not isinstance(workers, bool):
        raise TypeError(f"seed_everything(workers={workers!r}) is not valid; expected True or False.")
    os.environ[SEED_WORKERS_VARIABLE] = str(int(workers))
    random.seed(seed)
    torch.manual_seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed % 2**32)
    return seed


def worker_seeding_requested() -> bool:
    """Whether the last :func:`seed_everything` of this process (or of the one that started it) asked for
    ``workers=True``."""
    return os.environ.get(SEED_WORKERS_VARIABLE) == "1"


class SeedWorker:
    """A DataLoader ``worker_init_fn`` that seeds the worker's generators, then calls the loader's own one.

    A class rather than a closure so that loaders whose workers are spawned can pickle it.
    """

    def __init__(self, global_rank: int, then: Callable[[int], Any] | None) -> None:
        self.global_rank = global_rank
        self.then = then

    def __call__(self, worker_id: int) -> None:
        # torch gives worker i the seed base + i, with base drawn anew (from the seeded main process) per iterator.
        base = torch.initial_seed() - worker_id
        digest = hashlib.sha256(f"{base}:{worker_id}:{self.global_rank}".encode()).digest()
        torch_seed, python_seed, numpy_seed = (int.from_bytes(digest[i : i + 8], "little") for i in (0, 8, 16))
        torch.manual_seed(torch_seed >> 1)
        random.seed(python_seed)
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            numpy.random.seed(numpy_seed % 2**32)
        if self.then is not None:
            self.then(worker_id)


def with_seeded_workers(loader: Any, global_rank: int) -> Any:
    """A copy of ``loader`` whose worker processes :class:`SeedWorker` seeds; ``loader`` itself when it has none."""
    if not isinstance(loader, DataLoader) or loader.num_workers == 0 or isinstance(loader.worker_init_fn, SeedWorker):
        return loader
    seeded = copy.copy(loader)
    # A copy must start its own workers, not share the original's persistent ones.
    seeded._iterator = None
    seeded.worker_init_fn = SeedWorker(global_rank, loader.worker_init_fn)
    return seeded


def capture_rng_state() -> dict[str, Any]:
    """The state of every global generator this process uses."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        _, keys, position, has_gauss, cached_gaussian = numpy.random.get_state()
        state["numpy"] = {
            "keys": torch.from_numpy(keys.astype("int64")),
            "position": int(position),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put back what :func:`capture_rng_state` returned (entries for absent libraries are ignored)."""
    torch.set_rng_state(state["torch"])
    random.setstate(_as_python_state(state["python"]))
    numpy = sys.modules.get("numpy")
    if numpy is not None and "numpy" in state:
        saved = state["numpy"]
        keys = saved["keys"].numpy().astype("uint32")
        numpy.random.set_state(("MT19937", keys, saved["position"], saved["has_gauss"], saved["cached_gaussian"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@contextlib.contextmanager
def isolated_rng() -> Iterator[None]:
    """Run a block without it moving the global generators: training randomness then does not
    depend on whether, or how often, evaluation ran in between."""
    state = capture_rng_state()
    try:
        yield
    finally:
        restore_rng_state(state)


def loader_generators(loader: Any) -> list[torch.Generator]:
    """The explicit generators a DataLoader draws its order from (its own and its sampler's)."""
    found: list[torch.Generator] = []
    for owner in (
        loader,
        getattr(loader, "sampler", None),
        getattr(getattr(loader, "batch_sampler", None), "sampler", None),
    ):
        generator = getattr(owner, "generator", None)
        if isinstance(generator, torch.Generator) and all(generator is not seen for seen in found):
            found.append(generator)
    return found


def _as_python_state(state: Any) -> tuple[Any, ...]:
    # A checkpoint may give back lists where random.getstate() had tuples.
    version, internal, gauss = state
    return (version, tuple(internal), gauss)
