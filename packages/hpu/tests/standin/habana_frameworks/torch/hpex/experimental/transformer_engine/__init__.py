"""``habana_frameworks.torch.hpex.experimental.transformer_engine``: fp8 training.

``fp8_autocast`` records its use and computes in fp32; ``Linear`` is ``torch.nn.Linear`` under the engine's
name (its module path is what code looks at to see a converted layer).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from habana_frameworks import record
from habana_frameworks.torch.hpex.experimental.transformer_engine import fp8
from habana_frameworks.torch.hpex.experimental.transformer_engine.recipe import DelayedScaling


class Linear(torch.nn.Linear):
    pass


@contextlib.contextmanager
def fp8_autocast(enabled: bool = True, fp8_recipe: DelayedScaling | None = None, **kwargs: Any) -> Iterator[None]:
    record("fp8_autocast", enabled=enabled, recipe=None if fp8_recipe is None else repr(fp8_recipe))
    yield


__all__ = ["DelayedScaling", "Linear", "fp8", "fp8_autocast"]
