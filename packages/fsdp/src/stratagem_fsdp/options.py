"""FSDPStrategy's options: checked in the calling process, turned into ``fully_shard`` arguments in the workers."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from stratagem.mesh import MeshLayout
from stratagem.precision import MixedPrecision, Precision

ShardingStrategyName = Literal["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"]
StateDictType = Literal["sharded", "full"]
ModulePolicy = set[type[nn.Module]] | type[nn.Module] | Callable[..., bool]

SHARDING_STRATEGIES: tuple[ShardingStrategyName, ...] = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")
STATE_DICT_TYPES: tuple[StateDictType, ...] = ("sharded", "full")

# Lightning's FSDPStrategy options whose stratagem spelling differs.
_LIGHTNING_NAMES = {
    "precision_plugin": "precision= (on FSDPStrategy, or precision= on the Trainer)",
}

# fully_shard arguments the strategy sets from its own options; passing them through would bypass those.
_OWNED_ARGUMENTS = {
    "module": "the module (given by the Trainer)",
    "mesh": "sharding_strategy and device_mesh",
    "mp_policy": "mixed_precision",
    "offload_policy": "cpu_offload",
}


@dataclass(frozen=True)
class ShardingLayout:
    """Where a sharding strategy puts things: the device-mesh shape and whether units free parameters after forward.

    A 1-D mesh shards over every rank. A 2-D mesh ``(replicate, shard)`` shards within each
    group of ``shard`` ranks and keeps ``replicate`` copies, all-reducing gradients between them.
    """

    mesh_shape: tuple[int, ...]
    reshard_after_forward: bool

    @property
    def mesh_dim_names(self) -> tuple[str, ...]:
        return ("shard",) if len(self.mesh_shape) == 1 else ("replicate", "shard")

    @property
    def mesh_layout(self) -> MeshLayout:
        """The same ranks as a layout of core's mesh: ``dp_shard`` only, or ``dp_replicate x dp_shard``."""
        replicate, shard = self.mesh_shape if len(self.mesh_shape) == 2 else (1, self.mesh_shape[0])
        return MeshLayout(dp_replicate=replicate, dp_shard=shard)


def sharding_strategy_name(value: object) -> ShardingStrategyName:
    """The canonical name of ``value``: a name in any case, or torch's ``ShardingStrategy`` enum member."""
    name = getattr(value, "name", value)
    if isinstance(name, str):
        for known in SHARDING_STRATEGIES:
            if name.upper() == known:
                return known
    raise ValueError(
        f"sharding_strategy={value!r} is not valid; expected one of {', '.join(map(repr, SHARDING_STRATEGIES))}."
    )


_TORCH_STATE_DICT_TYPES: dict[str, StateDictType] = {"FULL_STATE_DICT": "full", "SHARDED_STATE_DICT": "sharded"}
"""Members of torch's ``StateDictType`` enum (FSDP1's, which Lightning users pass) -> stratagem's names."""


def check_state_dict_type(value: object) -> StateDictType:
    """``"sharded"`` or ``"full"``; torch's ``StateDictType.FULL_STATE_DICT`` / ``SHARDED_STATE_DICT`` mean the same."""
    for known in STATE_DICT_TYPES:
        if value == known:
            return known
    member = getattr(value, "name", None)
    if type(value).__name__ == "StateDictType" and member in _TORCH_STATE_DICT_TYPES:
        return _TORCH_STATE_DICT_TYPES[member]
    if member == "LOCAL_STATE_DICT":
        raise ValueError(
            "state_dict_type=StateDictType.LOCAL_STATE_DICT is not supported: its files load only into the same "
            "world size. Use 'sharded' (also per rank, and loads into any world size) or 'full'."
        )
    raise ValueError(f"state_dict_type={value!r} is not valid; expected 'sharded' or 'full'.")


def check_device_mesh(value: object, sharding_strategy: ShardingStrategyName) -> tuple[int, int] | None:
    if value is None:
        return None
    if sharding_strategy != "HYBRID_SHARD":
        raise ValueError(
            f"device_mesh={value!r} only applies to sharding_strategy='HYBRID_SHARD', not {sharding_strategy!r}."
        )
    if (
        not isinstance(value, tuple | list)
        or len(value) != 2
        or not all(isinstance(size, int) and not isinstance(size, bool) and size > 0 for size in value)
    ):
        raise ValueError(
            f"device_mesh={value!r} is not valid; expected (replicate, shard): two positive ints whose product is "
            "the number of processes, e.g. (num_nodes, devices)."
        )
    return (value[0], value[1])


def sharding_layout(
    sharding_strategy: ShardingStrategyName, world_size: int, num_nodes: int, device_mesh: tuple[int, int] | None
) -> ShardingLayout:
    """Map a sharding strategy onto ``fully_shard``: the mesh it shards over and when it frees gathered parameters."""
    if sharding_strategy == "FULL_SHARD":
        return ShardingLayout((world_size,), reshard_after_forward=True)
    if sharding_strategy == "SHARD_GRAD_OP":
        return ShardingLayout((world_size,), reshard_after_forward=False)
    if sharding_strategy == "NO_SHARD":
        # Shard groups of one rank: every rank keeps everything and gradients are all-reduced, as in DDP.
        return ShardingLayout((world_size, 1), reshard_after_forward=False)
    shape = device_mesh or (num_nodes, world_size // num_nodes)
    if shape[0] * shape[1] != world_size:
        raise ValueError(
            f"device_mesh={shape} has {shape[0] * shape[1]} ranks, but the run has {world_size} processes "
            f"(devices x num_nodes); give (replicate, shard) with replicate x shard = {world_size}."
        )
    return ShardingLayout(shape, reshard_after_forward=True)


def check_cpu_offload(value: object) -> bool | OffloadPolicy:
    if isinstance(value, bool | OffloadPolicy):
        return value
    raise TypeError(f"cpu_offload={value!r} is not valid; expected True, False or a torch CPUOffloadPolicy.")


def offload_policy(cpu_offload: bool | OffloadPolicy, device_type: str) -> OffloadPolicy:
    """The offload policy for ``device_type``; ``ValueError`` for pinned memory where no accelerator exists."""
    if cpu_offload is True:
        # Pinned host memory needs an accelerator; on a CPU-only run pinning fails.
        return CPUOffloadPolicy(pin_memory=device_type == "cuda")
    if cpu_offload is False:
        return OffloadPolicy()
    if isinstance(cpu_offload, CPUOffloadPolicy) and cpu_offload.pin_memory and device_type != "cuda":
        raise ValueError(
            f"cpu_offload=CPUOffloadPolicy(pin_memory=True) needs a CUDA device, but the accelerator is "
            f"{device_type!r}; use cpu_offload=True or CPUOffloadPolicy(pin_memory=False)."
        )
    return cpu_offload


def check_mixed_precision(value: object) -> MixedPrecisionPolicy | None:
    if value is None or isinstance(value, MixedPrecisionPolicy):
        return value
    raise TypeError(
        f"mixed_precision={value!r} is not valid; expected a torch.distributed.fsdp.MixedPrecisionPolicy, or None "
        "to derive it from the Trainer's precision."
    )


def mixed_precision_policy(policy: MixedPrecisionPolicy | None, precision: Precision) -> MixedPrecisionPolicy:
    """The user's policy, or one derived from the Trainer's precision.

    ``"bf16-mixed"``/``"16-mixed"`` keep fp32 sharded parameters (the optimizer steps those),
    gather them in the low dtype for compute and reduce gradients in fp32. ``"*-true"``
    precisions need no policy: the parameters already are in that dtype.
    """
    if policy is not None:
        return policy
    if isinstance(precision, MixedPrecision):
        return MixedPrecisionPolicy(param_dtype=precision.dtype, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def lightning_activation_checkpointing(kwargs: dict[str, Any], policy: ModulePolicy | None) -> ModulePolicy | None:
    """``activation_checkpointing_policy``, or Lightning's older ``activation_checkpointing`` (a class or a list of
    classes, taken from ``kwargs``) which means the same."""
    if "activation_checkpointing" not in kwargs:
        return policy
    classes: ModulePolicy = kwargs.pop("activation_checkpointing")
    if policy is not None:
        raise ValueError(
            "FSDPStrategy got both activation_checkpointing= (Lightning's older name) and "
            "activation_checkpointing_policy=; pass only activation_checkpointing_policy."
        )
    return classes


def check_fully_shard_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` if ``fully_shard`` accepts them all and the strategy does not set them itself."""
    accepted = [name for name in inspect.signature(fully_shard).parameters if name not in _OWNED_ARGUMENTS]
    for name in kwargs:
        if name in _LIGHTNING_NAMES:
            raise TypeError(f"FSDPStrategy({name}=...) is Lightning's name; stratagem's is {_LIGHTNING_NAMES[name]}.")
        if name in _OWNED_ARGUMENTS:
            raise TypeError(
                f"FSDPStrategy sets fully_shard's {name!r} from {_OWNED_ARGUMENTS[name]}; use that option instead."
            )
        if name not in accepted:
            raise TypeError(
                f"FSDPStrategy got an unknown option {name!r}. Options passed through to torch's fully_shard: "
                f"{', '.join(accepted)}."
            )
    return dict(kwargs)


@dataclass(frozen=True)
class ModuleSelector:
    """Decides which submodules an option applies to: a set of module classes, or a callable.

    A callable gets the module (``policy(module) -> bool``). Callables written for torch's
    older ``FullyShardedDataParallel`` (they take ``recurse`` and ``nonwrapped_numel``, e.g.
    ``functools.partial(size_based_auto_wrap_policy, min_num_params=...)``) are called as that
    API calls them for a leaf decision.
    """

    option: str
    classes: tuple[type[nn.Module], ...] = ()
    function: Callable[..., bool] | None = None
    legacy_signature: bool = False

    @classmethod
    def from_option(cls, option: str, policy: object) -> ModuleSelector | None:
        if policy is None:
            return None
        if isinstance(policy, type):
            # A single class means {that class}; called as a policy it would be instantiated on each module.
            policy = {policy}
        if isinstance(policy, set | frozenset | list | tuple):
            classes = tuple(policy)
            if classes and all(isinstance(item, type) and issubclass(item, nn.Module) for item in classes):
                _refuse_containers(option, classes)
                return cls(option, classes=classes)
        elif callable(policy):
            return cls(option, function=policy, legacy_signature=_takes_legacy_arguments(policy))
        raise TypeError(
            f"{option}={policy!r} is not valid; expected a non-empty set of nn.Module subclasses "
            "(e.g. {nn.TransformerEncoderLayer}) or a callable policy(module) -> bool."
        )

    def __call__(self, module: nn.Module, nonwrapped_numel: int) -> bool:
        if self.function is None:
            return isinstance(module, self.classes)
        if self.legacy_signature:
            return bool(self.function(module=module, recurse=False, nonwrapped_numel=nonwrapped_numel))
        return bool(self.function(module))


_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


def _refuse_containers(option: str, classes: tuple[type[nn.Module], ...]) -> None:
    containers = [item for item in classes if issubclass(item, _CONTAINERS)]
    if not containers:
        return
    names = ", ".join(
        f"nn.{item.__name__}" if item.__module__.startswith("torch.") else item.__name__ for item in containers
    )
    raise ValueError(
        f"{option} names {names}, a container class: it selects whatever it happens to hold (an nn.Sequential is "
        "often the whole model, so all of it becomes one unit), and nn.ModuleList/ModuleDict are never called, so "
        "nothing would happen. Name the layer classes inside it (e.g. {nn.TransformerEncoderLayer}), or pass a "
        "callable policy(module) -> bool that picks the submodules."
    )


def _takes_legacy_arguments(policy: Callable[..., Any]) -> bool:
    try:
        parameters: Iterable[str] = inspect.signature(policy).parameters
    except (TypeError, ValueError):
        return False
    return "recurse" in parameters
