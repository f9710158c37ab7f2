"""ModelParallelStrategy: tensor parallelism and ``fully_shard`` composed on one named device mesh."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from stratagem.environments.cluster_environment import ClusterEnvironment
from stratagem.mesh import Degree, MeshLayout
from stratagem.strategies import LayoutSharding, TakesMeshLayout
from stratagem_fsdp.options import ShardingLayout
from stratagem_fsdp.strategy import FSDPStrategy
from stratagem_fsdp.tp_plan import (
    TensorParallelPlan,
    apply_tp_plan,
    check_declared_heads,
    check_heads_split_evenly,
    check_num_heads,
    check_tp_plan,
)

# FSDPStrategy's options that a layout replaces, and what replaces them.
_LAYOUT_OPTIONS = {"sharding_strategy": "dp_replicate= and dp_shard=", "device_mesh": "dp_replicate= and dp_shard="}


class ModelParallelStrategy(FSDPStrategy, TakesMeshLayout):
    """Data, fully sharded and tensor parallelism composed on one device mesh (``dp_replicate x dp_shard x tp``).

    Each worker builds the mesh of :class:`stratagem.mesh.MeshLayout` once; the module reads it in
    ``configure_model`` as ``self.device_mesh`` and splits its layers over ``self.device_mesh["tp"]``
    (``parallelize_module(self.model, self.device_mesh["tp"], plan)``, as with Lightning's
    ``ModelParallelStrategy``), or the strategy splits them by ``tp_plan``. ``setup_module`` then applies, in
    this order, tensor parallelism (``tp_plan``), activation
    checkpointing (``activation_checkpointing_policy``) and ``fully_shard`` over the ``"dp_shard"``
    submesh, or over ``("dp_replicate", "dp_shard")`` (HSDP) when ``dp_replicate > 1``, per unit of
    ``auto_wrap_policy`` and at the root. The sampler splits data over the ``"dp"`` ranks only, logged
    values reduce over them, and gradient clipping takes the norm of the whole gradient.

    Options:

    - ``dp_replicate``, ``dp_shard``, ``tp``: the layout; ``-1`` or ``"auto"`` takes the ranks the others
      leave. Left out, ``tp`` is the devices per node and ``dp_shard`` the rest (Lightning's ``"auto"``).
    - ``data_parallel_size``, ``tensor_parallel_size``: Lightning's names for ``dp_shard`` and ``tp``.
    - ``save_distributed_checkpoint``: Lightning's name; ``False`` means ``state_dict_type="full"``.
    - ``tp_plan``: module name patterns mapped to ``"colwise"``, ``"rowwise"``, ``"sequence_parallel"`` or a
      torch ``ParallelStyle`` (:mod:`stratagem_fsdp.tp_plan`); a pattern that matches no module is an error.
    - ``num_heads``: the model's attention heads (a tuple for attention and key/value heads), checked against
      ``tp`` in the calling process. Undeclared, heads are checked on every rank before ``fully_shard``: a
      module declaring them (``num_heads``, ``n_head``, ``num_attention_heads``, ... or a ``config`` holding
      them) whose projections are split over ``"tp"`` must have a head count that ``tp`` divides.
    - :class:`~stratagem_fsdp.FSDPStrategy`'s other options (``activation_checkpointing_policy``,
      ``auto_wrap_policy``, ``mixed_precision``, ``cpu_offload``, ``state_dict_type``, ...) and those of
      every :class:`~stratagem.strategies.ParallelStrategy`.

    Checkpoints are FSDPStrategy's: a directory of shards through ``torch.distributed.checkpoint`` (or
    one full file), which every strategy and layout reads.
    """

    def __init__(
        self,
        *,
        dp_replicate: Degree = 1,
        dp_shard: Degree | None = None,
        tp: Degree | None = None,
        data_parallel_size: Degree | None = None,
        tensor_parallel_size: Degree | None = None,
        save_distributed_checkpoint: bool | None = None,
        tp_plan: TensorParallelPlan | None = None,
        num_heads: int | tuple[int, ...] | None = None,
        **options: Any,
    ) -> None:
        for name, replacement in _LAYOUT_OPTIONS.items():
            if name in options:
                raise TypeError(
                    f"ModelParallelStrategy({name}=...) is FSDPStrategy's; the mesh layout sets it: use {replacement}."
                )
        dp_shard = _one_spelling("dp_shard", dp_shard, "data_parallel_size", data_parallel_size)
        tp = _one_spelling("tp", tp, "tensor_parallel_size", tensor_parallel_size)
        if save_distributed_checkpoint is not None:
            if "state_dict_type" in options:
                raise ValueError(
                    "ModelParallelStrategy got both save_distributed_checkpoint= (Lightning's name) and "
                    "state_dict_type=; pass only state_dict_type ('sharded' or 'full')."
                )
            options["state_dict_type"] = "sharded" if save_distributed_checkpoint else "full"
        self.tp_plan = None if tp_plan is None else check_tp_plan(tp_plan)
        self.num_heads = None if num_heads is None else check_num_heads(num_heads)
        super().__init__(**options)
        # Neither given: Lightning's default, tensor parallel within a node (its size known once configured).
        self._tp_from_devices = dp_shard is None and tp is None
        self._layout_given = not self._tp_from_devices or dp_replicate != 1
        if self._tp_from_devices:
            tp = 1
        self._mesh_layout = MeshLayout(dp_replicate, -1 if dp_shard is None else dp_shard, -1 if tp is None else tp)

    mesh_dimensions: ClassVar[frozenset[str]] = frozenset({"dp_replicate", "dp_shard", "tp"})

    def use_layout(self, layout: MeshLayout) -> None:
        if self._layout_given and layout != self._mesh_layout:
            raise ValueError(
                f"layout=({layout}) disagrees with the layout ModelParallelStrategy was constructed with "
                f"({self._mesh_layout}); give the sizes once."
            )
        self._mesh_layout, self._tp_from_devices = layout, False

    def configure_placement(
        self, *, devices: list[torch.device], num_nodes: int, cluster_environment: ClusterEnvironment
    ) -> None:
        if self._tp_from_devices and self._mesh_layout is not None:
            per_node = len(self.parallel_devices or devices)
            self._mesh_layout = MeshLayout(self._mesh_layout.dp_replicate, -1, per_node)
        super().configure_placement(devices=devices, num_nodes=num_nodes, cluster_environment=cluster_environment)
        if self.num_heads is not None:
            check_declared_heads(self.num_heads, int(self._resolved_layout.tp))

    def layout_sharding(self, devices_per_node: int) -> LayoutSharding:
        layout = self._mesh_layout
        assert layout is not None  # set in __init__
        default = {name: int(getattr(layout, name)) for name in layout.dim_names}
        if self._tp_from_devices:
            default["tp"] = devices_per_node
        return replace(
            super().layout_sharding(devices_per_node),
            dimensions=tuple(name for name in layout.dim_names if name in self.mesh_dimensions),
            default=default,
            options=None,
        )

    def complete_configuration(self) -> None:
        super().complete_configuration()
        layout = self._resolved_layout
        self._layout = ShardingLayout((int(layout.dp_replicate), int(layout.dp_shard)), reshard_after_forward=True)

    @property
    def _resolved_layout(self) -> MeshLayout:
        if self._mesh_layout is None:
            raise RuntimeError("ModelParallelStrategy is not configured yet; create it with stratagem.resolve().")
        return self._mesh_layout

    @property
    def device_mesh(self) -> DeviceMesh:
        """The layout's whole mesh (``mesh["tp"]``, ``mesh["dp"]``, ...); ``fully_shard`` shards over its data-parallel
        submesh."""
        mesh = self._layout_mesh
        if mesh is None:
            raise RuntimeError(f"{type(self).__name__}.device_mesh exists once setup_environment() ran in the worker.")
        return mesh

    @contextlib.contextmanager
    def module_init_context(self, empty_init: bool | None = None) -> Iterator[None]:
        # Layers split in configure_model (parallelize_module) are distributed from each tensor-parallel group's
        # own tensors, with collectives over that group: fsdp's build on rank 0 alone (the other ranks on the meta
        # device) would leave the other ranks' pieces empty and their collectives unmatched. Every rank builds
        # normally; setup_module then gives every rank rank 0's plain tensors and the first data rank's pieces.
        with super().module_init_context(empty_init=False):
            yield

    def _split_layers(self, module: nn.Module) -> None:
        if self.tp_plan is not None:
            apply_tp_plan(module, self.device_mesh["tp"], self.tp_plan)
        check_heads_split_evenly(module, int(self._resolved_layout.tp))
        self._agree_on_split_tensors(module)

    def _agree_on_split_tensors(self, module: nn.Module) -> None:
        """Give every data-parallel rank the first one's pieces of layers split in ``configure_model``.

        A module built normally on every rank holds each rank's own draw; splitting it keeps every
        tensor-parallel group's own, which the plain-tensor broadcast of FSDPStrategy does not reach.
        """
        group = self.data_parallel_group
        if group is None or dist.get_world_size(group) == 1:
            return
        source = dist.get_global_rank(group, 0)
        with torch.no_grad():
            for tensor in (*module.parameters(), *module.buffers()):
                # Tensors already sharded over data-parallel ranks (a module set up before, or sharded by hand in
                # configure_model) hold a different piece on each of them, and are left alone.
                if isinstance(tensor, DTensor) and not tensor.is_meta and _split_over_tp_only(tensor):
                    dist.broadcast(tensor.to_local(), src=source, group=group)

    def __repr__(self) -> str:
        return (
            f"ModelParallelStrategy({self._mesh_layout}, devices={self.num_processes}, num_nodes={self.num_nodes}, "
            f"state_dict_type={self.state_dict_type!r}, start_method={self.start_method!r})"
        )


def _one_spelling(
    name: str, value: Degree | None, lightning_name: str, lightning_value: Degree | None
) -> Degree | None:
    if value is not None and lightning_value is not None:
        raise ValueError(
            f"ModelParallelStrategy got both {name}={value!r} and {lightning_name}={lightning_value!r} (Lightning's "
            f"name for {name}); pass one."
        )
    return lightning_value if value is None else value


def _split_over_tp_only(tensor: DTensor) -> bool:
    return set(tensor.device_mesh.mesh_dim_names or ()) <= {"tp"}
