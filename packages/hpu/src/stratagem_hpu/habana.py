"""Habana's modules, imported when first needed (never when stratagem lists or discovers names)."""

from __future__ import annotations

import importlib
from types import ModuleType

from stratagem_hpu import availability


def _habana_module(name: str) -> ModuleType:
    problem = availability.habana_problem()
    if problem is not None:
        raise RuntimeError(f"stratagem-hpu needs {name}: {problem}.")
    return importlib.import_module(name)


def core() -> ModuleType:
    """``habana_frameworks.torch.core``: ``mark_step``, ``is_lazy``."""
    return _habana_module("habana_frameworks.torch.core")


def hpu() -> ModuleType:
    """``habana_frameworks.torch.hpu``: device queries, ``memory_stats``, ``wrap_in_hpu_graph``."""
    return _habana_module("habana_frameworks.torch.hpu")


def hccl() -> ModuleType:
    """``habana_frameworks.torch.distributed.hccl``: importing it registers the ``hccl`` process-group backend."""
    return _habana_module("habana_frameworks.torch.distributed.hccl")


def transformer_engine() -> ModuleType:
    """``habana_frameworks.torch.hpex.experimental.transformer_engine``: fp8 training."""
    return _habana_module("habana_frameworks.torch.hpex.experimental.transformer_engine")


def compile_backend() -> str:
    """The ``torch.compile`` backend Habana registers when ``habana_frameworks.torch`` is imported."""
    _habana_module("habana_frameworks.torch")
    return "hpu_backend"
