"""FSDPStrategy: fully sharded data parallel training on PyTorch's ``fully_shard``."""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, cast

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer
from torch.utils._pytree import tree_map

from stratagem.checkpoint_io import CheckpointError, CheckpointIO, LazyCheckpoint, PathLike, read_full_checkpoint
from stratagem.strategies import (
    BackwardSyncControl,
    BlockPolicy,
    MemoryEstimate,
    ModelFootprint,
    ParallelStrategy,
    check_release_host_memory,
    release_freed_host_memory,
    releases_host_memory,
    split_parallel_options,
)
from stratagem.strategies.compilation import strip_compile_prefix
from stratagem_fsdp.checkpoint_io import DistributedCheckpointIO
from stratagem_fsdp.materialize import has_meta_tensors, materialize
from stratagem_fsdp.memory import RELEASING_STEP_TIME, fsdp_estimate
from stratagem_fsdp.optimizer_state import parameter_names, to_index_keyed, to_name_keyed
from stratagem_fsdp.options import (
    ModulePolicy,
    ModuleSelector,
    ShardingLayout,
    ShardingStrategyName,
    StateDictType,
    check_cpu_offload,
    check_device_mesh,
    check_fully_shard_kwargs,
    check_mixed_precision,
    check_state_dict_type,
    lightning_activation_checkpointing,
    mixed_precision_policy,
    offload_policy,
    sharding_layout,
    sharding_strategy_name,
)
from stratagem_fsdp.rank_zero_init import broadcast_from_rank_zero
from stratagem_fsdp.wrapping import (
    ShardedRoot,
    apply_activation_checkpointing,
    manual_wrapping,
    shard_module,
    sharded_root_of,
)

_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


class FSDPStrategy(ParallelStrategy, BackwardSyncControl):
    """Shards parameters, gradients and optimizer state over the ranks with PyTorch's ``fully_shard`` (FSDP2).

    Runs on CPU (gloo) and CUDA (nccl). Options:

    - ``sharding_strategy``: ``"FULL_SHARD"`` (default), ``"SHARD_GRAD_OP"``, ``"NO_SHARD"`` or
      ``"HYBRID_SHARD"`` (torch's ``ShardingStrategy`` members are accepted too); see the
      package README for how each maps onto ``fully_shard``. ``device_mesh=(replicate, shard)``
      shapes ``"HYBRID_SHARD"`` (default: ``(num_nodes, devices)``).
    - ``auto_wrap_policy``: which submodules become their own FSDP unit (gathered one at a
      time): a set of module classes or a callable. The root is always a unit.
    - ``activation_checkpointing_policy``: which submodules recompute activations in backward.
    - ``cpu_offload``: ``True`` or a ``CPUOffloadPolicy`` keeps shards and optimizer steps on the CPU.
    - ``mixed_precision``: a ``MixedPrecisionPolicy``; by default derived from the Trainer's precision.
    - ``state_dict_type``: ``"sharded"`` (a directory, each rank writing its shards) or
      ``"full"`` (one file written by rank 0). Both load into any strategy and world size.
    - the options of every :class:`~stratagem.strategies.ParallelStrategy` (``start_method``, ``timeout``,
      ``process_group_backend``, ...; see :class:`~stratagem.strategies.ParallelOptions`).
    - other keyword options go to ``fully_shard`` (``reshard_after_forward``, ``shard_placement_fn``, ...).
    """

    def __init__(
        self,
        *,
        cpu_offload: bool | OffloadPolicy = False,
        mixed_precision: MixedPrecisionPolicy | None = None,
        auto_wrap_policy: ModulePolicy | None = None,
        activation_checkpointing_policy: ModulePolicy | None = None,
        sharding_strategy: ShardingStrategyName | Any = "FULL_SHARD",
        state_dict_type: StateDictType = "sharded",
        device_mesh: tuple[int, int] | None = None,
        release_host_memory: bool | None = None,
        **options: Any,
    ) -> None:
        parallel_options, kwargs = split_parallel_options(options)
        super().__init__(**parallel_options)
        self._release_host_memory = check_release_host_memory("FSDPStrategy", release_host_memory)
        self.sharding_strategy = sharding_strategy_name(sharding_strategy)
        self.state_dict_type = check_state_dict_type(state_dict_type)
        self.cpu_offload = check_cpu_offload(cpu_offload)
        self.mixed_precision = check_mixed_precision(mixed_precision)
        self._device_mesh_shape = check_device_mesh(device_mesh, self.sharding_strategy)
        self._auto_wrap = ModuleSelector.from_option("auto_wrap_policy", auto_wrap_policy)
        activation_checkpointing_policy = lightning_activation_checkpointing(kwargs, activation_checkpointing_policy)
        self._activation_checkpointing = ModuleSelector.from_option(
            "activation_checkpointing_policy", activation_checkpointing_policy
        )
        self._fully_shard_kwargs = check_fully_shard_kwargs(kwargs)
        self._layout: ShardingLayout | None = None
        self._offload_policy: OffloadPolicy | None = None
        self._device_mesh: DeviceMesh | None = None
        self._weights_will_be_loaded = False

    def complete_configuration(self) -> None:
        self._layout = sharding_layout(
            self.sharding_strategy, self.num_processes * self.num_nodes, self.num_nodes, self._device_mesh_shape
        )
        self._offload_policy = offload_policy(self.cpu_offload, self.accelerator.device_type)

    def estimate_memory(self, footprint: ModelFootprint) -> MemoryEstimate:
        estimate = fsdp_estimate(footprint, self._configured_layout, self._auto_wrap, offload=bool(self.cpu_offload))
        if self.releases_host_memory:
            estimate = replace(estimate, relative_step_time=estimate.relative_step_time * RELEASING_STEP_TIME)
        return estimate

    @property
    def releases_host_memory(self) -> bool:
        """Whether each rank has the allocator return freed tensors' memory at once (``release_host_memory``;
        by default on the CPU accelerator, see :func:`stratagem.strategies.releases_host_memory`)."""
        return releases_host_memory(self._release_host_memory, self.accelerator.device_type)

    @property
    def checkpoint_io(self) -> CheckpointIO:
        """Unless one is given: :class:`DistributedCheckpointIO` for sharded checkpoints, else one file by torch."""
        if self._checkpoint_io is None and self.state_dict_type == "sharded":
            self._checkpoint_io = DistributedCheckpointIO()
        return super().checkpoint_io

    @checkpoint_io.setter
    def checkpoint_io(self, checkpoint_io: CheckpointIO) -> None:
        self._checkpoint_io = checkpoint_io

    def checkpoint_io_problem(self, checkpoint_io: CheckpointIO) -> str | None:
        if self.state_dict_type == "sharded" and not checkpoint_io.writes_collectively:
            return (
                "state_dict_type='sharded' has every rank write its own shards, so the IO must be one that every rank "
                "calls together (writes_collectively=True, e.g. plugins='distributed_checkpoint'), but this one is "
                "called by rank 0 alone. Use state_dict_type='full' to gather the state on rank 0 and write it "
                "through this IO, or leave it out of plugins=."
            )
        if self.state_dict_type == "full" and checkpoint_io.writes_collectively:
            return (
                "state_dict_type='full' writes one file from rank 0 with the state gathered there, but this IO must "
                "be called by every rank together (writes_collectively=True). Use state_dict_type='sharded' with it, "
                "or another checkpoint IO."
            )
        return None

    @property
    def device_mesh(self) -> DeviceMesh:
        """The mesh parameters are sharded over; available from :meth:`setup_environment` on.

        For modules sharded by hand in ``configure_model``: ``fully_shard(block, mesh=strategy.device_mesh)``.
        """
        if self._device_mesh is None:
            raise RuntimeError("FSDPStrategy.device_mesh exists once setup_environment() has run in the worker.")
        return self._device_mesh

    def setup_environment(self) -> None:
        super().setup_environment()
        if self.releases_host_memory:
            release_freed_host_memory()
        layout = self._configured_layout
        self._device_mesh = init_device_mesh(
            self.root_device.type, layout.mesh_shape, mesh_dim_names=layout.mesh_dim_names
        )
        self._make_grad_scaler_shard_aware()

    def _make_grad_scaler_shard_aware(self) -> None:
        """Swap the precision's gradient scaler (``"16-mixed"``) for one that agrees on overflow across ranks.

        Each rank sees only its shard of the gradients; without agreement one rank would skip a
        step that another takes.
        """
        scaler = getattr(self.precision, "scaler", None)
        if not isinstance(scaler, torch.amp.GradScaler) or isinstance(scaler, ShardedGradScaler):
            return
        sharded = ShardedGradScaler(self.root_device.type, enabled=scaler.is_enabled())
        if scaler.is_enabled():
            sharded.load_state_dict(scaler.state_dict())
        setattr(self.precision, "scaler", sharded)  # noqa: B010 - only mixed precisions have the attribute

    @contextlib.contextmanager
    def module_init_context(self, empty_init: bool | None = None) -> Iterator[None]:
        # Unless asked not to, build on the meta device: no memory, no initialisation until setup_module
        # has sharded the module and materialises each rank's shards.
        self._weights_will_be_loaded = bool(empty_init)
        if empty_init is False:
            with super().module_init_context(empty_init), manual_wrapping():
                yield
            return
        with torch.device("meta"), self.precision.module_init_context(), manual_wrapping():
            yield

    def setup_module(self, module: nn.Module) -> nn.Module:
        root = sharded_root_of(module)
        if root is not None:
            # Set up before in this process (fit, then test): its parameters are already shards.
            self._module, self._model = module, root
            return root
        module = self.precision.convert_module(module)
        if self._activation_checkpointing is not None:
            apply_activation_checkpointing(module, self._activation_checkpointing)
        unit_kwargs = {
            "reshard_after_forward": self._configured_layout.reshard_after_forward,
            "mp_policy": mixed_precision_policy(self.mixed_precision, self.precision),
            "offload_policy": self._configured_offload_policy,
            **self._fully_shard_kwargs,
        }
        # The root's parameters are needed again as soon as backward starts: freeing them after the
        # step's forward would only gather them again at once (fully_shard's own default for roots).
        root_kwargs = {
            **unit_kwargs,
            "reshard_after_forward": self._fully_shard_kwargs.get("reshard_after_forward", False),
        }
        # A module built normally holds each rank's own draw; sharding would keep a slice of each.
        broadcast_from_rank_zero(module, self.root_device)
        root = shard_module(module, self._auto_wrap, self.device_mesh, unit_kwargs, root_kwargs)
        if has_meta_tensors(root):
            offloaded = isinstance(self._configured_offload_policy, CPUOffloadPolicy)
            storage = torch.device("cpu") if offloaded else self.root_device
            uninitialised = materialize(root, storage, self.root_device, initialise=not self._weights_will_be_loaded)
            if uninitialised and self.is_global_zero:
                names = ", ".join(name.removeprefix("module.") for name in uninitialised)
                warnings.warn(
                    f"Modules created on the meta device hold uninitialised memory because they define no "
                    f"reset_parameters(): {names}. Define it, load weights into them, or create the model with "
                    "empty_init=False.",
                    stacklevel=2,
                )
        self._module, self._model = module, root
        return root

    def compile_blocks(self) -> BlockPolicy | None:
        # The FSDP units are the blocks: each compiled region then runs between its unit's gather and free.
        selector = self._auto_wrap
        if selector is None:
            return None
        return lambda module: selector(module, sum(parameter.numel() for parameter in module.parameters()))

    def setup_optimizers(self, optimizers: list[Optimizer]) -> list[Optimizer]:
        optimizers = super().setup_optimizers(optimizers)
        for optimizer in optimizers:
            # Sharding replaced the parameters: an optimizer made before setup would step stale copies.
            parameter_names(self.module, optimizer)
        return optimizers

    def no_backward_sync(self, enabled: bool) -> contextlib.AbstractContextManager[Any]:
        if not enabled:
            return contextlib.nullcontext()
        return self._without_gradient_sync()

    @contextlib.contextmanager
    def _without_gradient_sync(self) -> Iterator[None]:
        root = cast(FSDPModule, self._sharded_root)
        root.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            root.set_requires_gradient_sync(True)

    def clip_gradients(
        self, optimizer: Optimizer, clip_val: float, algorithm: Literal["norm", "value"] = "norm"
    ) -> torch.Tensor | None:
        self.precision.unscale_gradients(optimizer)
        parameters = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if algorithm == "value":
            torch.nn.utils.clip_grad_value_(parameters, clip_val)
            return None
        # Each rank holds a shard of every gradient: the norm of the whole gradient needs their sum.
        norm = torch.nn.utils.get_total_norm([p.grad for p in parameters])
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        torch.nn.utils.clip_grads_with_norm_(parameters, clip_val, norm)
        return norm

    # -- checkpoints ------------------------------------------------------------------------

    def save_checkpoint(self, path: PathLike, state: dict[str, Any]) -> None:
        self._require_live_process_group(f"save_checkpoint({str(path)!r})")
        if self.state_dict_type == "sharded":
            sharded = {key: self._state_of_sharded(value) for key, value in state.items()}
            self.checkpoint_io.save_checkpoint(sharded, path)
            return
        full = {key: self._state_of_full(value) for key, value in state.items()}
        self.write_on_rank_zero(
            functools.partial(self.checkpoint_io.save_checkpoint, full, path), f"save_checkpoint({str(path)!r})"
        )

    def load_checkpoint(
        self, path: PathLike, state: dict[str, Any], strict: bool = True, weights_only: bool = True
    ) -> dict[str, Any]:
        targets = {key: value for key, value in state.items() if _is_live(value)}
        if DistributedCheckpointIO.can_read(path):
            template = {key: self._state_of_sharded(target) for key, target in targets.items()}
            remaining = self._distributed_checkpoint_io.load_into(path, template, strict, weights_only)
            for key, target in targets.items():
                self._load_state(target, template[key], StateDictOptions(strict=strict))
            return remaining
        return self._load_whole_checkpoint(Path(path), targets, strict, weights_only)

    def _load_whole_checkpoint(
        self, path: Path, targets: dict[str, Any], strict: bool, weights_only: bool
    ) -> dict[str, Any]:
        """Rank 0 reads a whole checkpoint (any strategy's); each tensor is broadcast and every rank keeps its shard.

        Entries the reader deferred and nobody took stay unread: rank 0 sends the others, and each rank reads
        a deferred one itself if its caller takes it."""
        checkpoint = LazyCheckpoint()
        taken: dict[str, Any] = {}
        problem = None
        if self.is_global_zero:
            try:
                checkpoint = LazyCheckpoint.shallow_copy(
                    read_full_checkpoint(path, self.checkpoint_io, weights_only, required=list(targets))
                )
                # Taken here, so that an entry the reader deferred fails inside the verdict too.
                taken = {key: checkpoint.pop(key) for key in targets}
            except CheckpointError as error:
                # Every rank waits for rank 0's verdict; each raises it rather than waiting forever.
                problem = str(error)
        problem = self.broadcast(problem)
        if problem:
            raise CheckpointError(problem)
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=strict)
        for key, target in targets.items():
            self._load_state(target, taken.get(key), options, index_keyed=True)
        read, unread = self.broadcast((checkpoint.read_entries(), checkpoint.unread_keys()))
        if self.is_global_zero:
            return checkpoint
        remaining = LazyCheckpoint(read)
        for key in unread:
            remaining.defer(key, functools.partial(_read_entry, path, self.checkpoint_io, weights_only, key))
        return remaining

    def module_full_state_dict(self) -> dict[str, Any]:
        return _full_model_state(self.module)

    def _state_of_sharded(self, value: Any) -> Any:
        if isinstance(value, nn.Module):
            return get_model_state_dict(value)
        if isinstance(value, Optimizer):
            return get_optimizer_state_dict(self.module, value)
        if _is_optimizer_list(value):
            return [self._state_of_sharded(optimizer) for optimizer in value]
        return value

    def _state_of_full(self, value: Any) -> Any:
        """Whole state on rank 0 (gathered one tensor at a time onto its CPU); other ranks get ``{}``."""
        if isinstance(value, nn.Module):
            return _full_model_state(value)
        if isinstance(value, Optimizer):
            state = get_optimizer_state_dict(self.module, value, options=_FULL)
            if not state:
                return state
            live = [item for per_parameter in value.state.values() for item in per_parameter.values()]
            return to_index_keyed(_unaliased(state, [item for item in live if isinstance(item, torch.Tensor)]))

        if _is_optimizer_list(value):
            return [self._state_of_full(optimizer) for optimizer in value]
        return value

    def _load_state(self, target: Any, value: Any, options: StateDictOptions, index_keyed: bool = False) -> None:
        """Load ``value`` into ``target``. Whole states broadcast from rank 0 come with ``index_keyed`` optimizers."""
        if isinstance(target, nn.Module):
            set_model_state_dict(target, strip_compile_prefix(value or {}), options=options)
        elif isinstance(target, Optimizer):
            if index_keyed and value:
                value = to_name_keyed(value, parameter_names(self.module, target))
            set_optimizer_state_dict(self.module, target, value or {}, options=options)
        else:
            values = value if value is not None else [None] * len(target)
            if len(values) != len(target):
                raise ValueError(
                    f"The checkpoint holds {len(values)} optimizer state(s) for {len(target)} optimizer(s)."
                )
            for optimizer, optimizer_state in zip(target, values):
                self._load_state(optimizer, optimizer_state, options, index_keyed)

    @property
    def _distributed_checkpoint_io(self) -> DistributedCheckpointIO:
        if isinstance(self._checkpoint_io, DistributedCheckpointIO):
            return self._checkpoint_io
        return DistributedCheckpointIO()

    # -- state set up by configure / setup_* --------------------------------------------------

    @property
    def _configured_layout(self) -> ShardingLayout:
        if self._layout is None:
            raise RuntimeError("FSDPStrategy is not configured yet; create it with stratagem.resolve().")
        return self._layout

    @property
    def _configured_offload_policy(self) -> OffloadPolicy:
        if self._offload_policy is None:
            raise RuntimeError("FSDPStrategy is not configured yet; create it with stratagem.resolve().")
        return self._offload_policy

    @property
    def _sharded_root(self) -> ShardedRoot:
        model = self.model
        if not isinstance(model, ShardedRoot):
            raise RuntimeError("setup_module() has not been called")
        return model

    def teardown(self) -> None:
        super().teardown()
        self._device_mesh = None

    def __repr__(self) -> str:
        return (
            f"FSDPStrategy(devices={self.num_processes}, num_nodes={self.num_nodes}, "
            f"sharding_strategy={self.sharding_strategy!r}, state_dict_type={self.state_dict_type!r}, "
            f"cpu_offload={self.cpu_offload!r}, start_method={self.start_method!r})"
        )


def _full_model_state(module: nn.Module) -> dict[str, Any]:
    """The whole state dict on rank 0's CPU, sharing no memory with the live module."""
    return _unaliased(get_model_state_dict(module, options=_FULL), [*module.parameters(), *module.buffers()])


def _unaliased(state: Any, live: list[torch.Tensor]) -> Any:
    """``state`` with copies of the tensors that share memory with ``live`` ones.

    Where nothing needs gathering (one rank, ``NO_SHARD``, buffers, optimizer step counters),
    torch returns the live tensors themselves, which the next optimizer step would change
    under whoever holds the state (a checkpoint written in the background, say).
    """
    addresses = {_storage_address(tensor) for tensor in live}

    def copy_if_live(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and _storage_address(value) in addresses:
            return value.clone()
        return value

    return tree_map(copy_if_live, state)


def _storage_address(tensor: torch.Tensor) -> int:
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.untyped_storage().data_ptr()


def _is_optimizer_list(value: Any) -> bool:
    return isinstance(value, list | tuple) and bool(value) and all(isinstance(item, Optimizer) for item in value)


def _is_live(value: Any) -> bool:
    return isinstance(value, nn.Module | Optimizer) or _is_optimizer_list(value)


def _read_entry(path: Path, checkpoint_io: CheckpointIO, weights_only: bool, key: str) -> Any:
    return read_full_checkpoint(path, checkpoint_io, weights_only)[key]
