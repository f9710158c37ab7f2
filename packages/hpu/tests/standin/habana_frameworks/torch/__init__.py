"""``habana_frameworks.torch``: importing it registers the ``hpu_backend`` compiler with ``torch.compile``, as
Habana's bridge does."""

from __future__ import annotations

from typing import Any

import torch


def _hpu_backend(graph_module: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    from habana_frameworks import record

    record("hpu_backend", nodes=len(graph_module.graph.nodes))
    return graph_module.forward


def _register_compile_backend() -> None:
    from torch._dynamo import list_backends, register_backend

    if "hpu_backend" not in list_backends(exclude_tags=()):
        register_backend(name="hpu_backend")(_hpu_backend)


_register_compile_backend()
