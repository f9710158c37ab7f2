"""Random-number-generator state: seeding, saving in checkpoints, and isolating evaluation.

States are kept as tensors, ints and tuples so that checkpoints load with ``weights_only=True``.
"""

from __future__ import annotations

import contextlib
import random
import sys
from collections.abc import Iterator
from typing import Any

import torch


def seed_everything(seed: int) -> None:
    """Seed Python's, torch's (all devices) and, when it is loaded, numpy's global generators."""
    random.seed(seed)
    torch.manual_seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed % 2**32)


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
