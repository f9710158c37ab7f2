"""A named parallel layout: how a run's ranks are divided between pipeline, data and tensor parallelism.

A layout is checked in the calling process, against the run's world size, before any process
starts (:meth:`MeshLayout.resolved`); every worker then builds it once as a torch ``DeviceMesh``
(:meth:`MeshLayout.build`) with named dimensions, pipeline stages outermost and tensor parallelism
innermost so that the ranks of one tensor-parallel group are neighbours (on one node where they can be):

- ``"pp"``: pipeline stages, each holding its own blocks of the model;
- ``"dp_replicate"``: groups that hold whole copies and all-reduce gradients (HSDP's replicas);
- ``"dp_shard"``: ranks that shard parameters, gradients and optimizer state (FSDP);
- ``"tp"``: ranks that split each layer's tensors (tensor parallelism);
- ``"dp"``: ``dp_replicate`` and ``dp_shard`` flattened, the ranks that see different data.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

Degree = int | Literal["auto"]
"""A dimension's size: a positive int, or ``-1`` / ``"auto"`` for the ranks the other dimensions leave."""

DATA_PARALLEL = "dp"
"""The name of the flattened data-parallel submesh."""

# The meshes this process built, by device type and shape, with the joined group they were built over.
_BUILT_MESHES: dict[tuple[str, tuple[int, ...]], tuple[weakref.ref[Any], DeviceMesh, DeviceMesh]] = {}


@dataclass(frozen=True)
class MeshLayout:
    """The sizes of a run's parallel dimensions; their product is the world size (``devices x num_nodes``).

    At most one dimension is ``-1`` (or ``"auto"``): it takes the ranks the others leave. ``pp`` is given by
    keyword only, so that ``MeshLayout(dp_replicate, dp_shard, tp)`` keeps its meaning.
    """

    pp: Degree = field(default=1, kw_only=True)
    dp_replicate: Degree = 1
    dp_shard: Degree = -1
    tp: Degree = 1

    def __post_init__(self) -> None:
        for dimension in fields(self):
            value = getattr(self, dimension.name)
            if value == "auto":
                object.__setattr__(self, dimension.name, -1)
            elif isinstance(value, bool) or not isinstance(value, int) or (value < 1 and value != -1):
                raise ValueError(
                    f"{dimension.name}={value!r} is not a valid mesh size; expected a positive int, or -1 / 'auto' "
                    "for the ranks the other dimensions leave."
                )
        rest = [name for name in self.dim_names if getattr(self, name) == -1]
        if len(rest) > 1:
            raise ValueError(
                f"{' and '.join(f'{name}=-1' for name in rest)}: at most one mesh dimension may take the ranks "
                "that are left; give the others as sizes."
            )

    @property
    def dim_names(self) -> tuple[str, ...]:
        """The mesh's dimensions, outermost first."""
        return tuple(dimension.name for dimension in fields(self))

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(getattr(self, name)) for name in self.dim_names)

    def resolved(self, world_size: int) -> MeshLayout:
        """This layout with ``-1`` replaced by the ranks that are left; ``ValueError`` when it cannot fill
        ``world_size`` ranks."""
        sizes = {name: int(getattr(self, name)) for name in self.dim_names}
        given = math.prod(size for size in sizes.values() if size != -1)
        described = ", ".join(f"{name}={size}" for name, size in sizes.items())
        rest = [name for name, size in sizes.items() if size == -1]
        if rest and world_size % given == 0:
            return replace(self, **{rest[0]: world_size // given})
        if not rest and given == world_size:
            return self
        if rest:
            problem = f"the other sizes multiply to {given}, which does not divide the {world_size} processes"
            fits = f"Give sizes whose product divides {world_size}"
        else:
            problem = f"they multiply to {given}, not to the {world_size} processes"
            fits = f"Give sizes whose product is {world_size}, or set one of them to -1"
        raise ValueError(
            f"The mesh layout ({described}) does not fit the run: {problem} (devices x num_nodes = {world_size}). "
            f"{fits}."
        )

    @property
    def data_parallel_size(self) -> int:
        """How many ranks see different data (``dp_replicate x dp_shard``); call on a :meth:`resolved` layout."""
        return int(self.dp_replicate) * int(self.dp_shard)

    def data_parallel_rank(self, global_rank: int) -> int:
        """This rank's place among the data-parallel ranks: its coordinate on the flattened ``"dp"`` submesh."""
        return global_rank // int(self.tp) % self.data_parallel_size

    def pipeline_rank(self, global_rank: int) -> int:
        """This rank's pipeline stage position: its coordinate on the ``"pp"`` submesh."""
        return global_rank // (self.data_parallel_size * int(self.tp))

    def build(self, device_type: str) -> tuple[DeviceMesh, DeviceMesh]:
        """The layout as a ``DeviceMesh`` over the joined process group, and its flattened ``"dp"`` submesh.

        Every dimension is kept, size 1 too, so that ``mesh["tp"]`` exists whatever the sizes. A process builds
        each layout once per joined group and reuses it in later runs: every dimension that does not span the
        world is a process group of its own, and a Gloo group that DDP or FSDP has used keeps its threads even
        after it is destroyed, so building anew for each run would add threads for as long as the process lives.
        """
        import torch.distributed as dist

        key = (device_type, self.shape)
        built = _BUILT_MESHES.get(key)
        if built is not None and dist.is_initialized() and built[0]() is dist.group.WORLD:
            return built[1], built[2]
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device_type, self.shape, mesh_dim_names=self.dim_names)
        # Kept, not looked up again as mesh["dp"]: torch deprecates slicing a flattened dimension from the root.
        data_parallel = mesh["dp_replicate", "dp_shard"]._flatten(DATA_PARALLEL)
        # Read after the build: init_device_mesh joins the default group itself when none was joined yet.
        _BUILT_MESHES[key] = (weakref.ref(dist.group.WORLD), mesh, data_parallel)
        return mesh, data_parallel

    def __str__(self) -> str:
        return ", ".join(f"{name}={getattr(self, name)}" for name in self.dim_names)


def parse_layout(value: object) -> MeshLayout:
    """A layout from ``value``: a :class:`MeshLayout`, a dict of sizes (``{"dp_shard": 2, "tp": 2}``) or the same
    as text (``"dp_shard=2,tp=2"``). Dimensions left out take the defaults (``dp_shard=-1``, the others 1)."""
    if isinstance(value, MeshLayout):
        return value
    names = [dimension.name for dimension in fields(MeshLayout)]
    sizes: dict[str, object]
    if isinstance(value, str):
        sizes = {}
        for item in filter(None, (part.strip() for part in value.split(","))):
            name, equals, size = item.partition("=")
            if not equals:
                raise ValueError(f"layout={value!r}: {item!r} is not name=size; expected e.g. 'dp_shard=2,tp=2'.")
            sizes[name.strip()] = size.strip() if size.strip() == "auto" else _size(value, size.strip())
    elif isinstance(value, dict):
        sizes = dict(value)
    else:
        raise TypeError(
            f"layout={value!r} is not a mesh layout; expected a MeshLayout, a dict of sizes or text such as "
            "'dp_shard=2,tp=2'."
        )
    unknown = sorted(str(name) for name in sizes if name not in names)
    if unknown:
        raise ValueError(f"layout={value!r} names {', '.join(unknown)}; its dimensions are {', '.join(names)}.")
    return MeshLayout(**sizes)  # type: ignore[arg-type]


def _size(layout: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"layout={layout!r}: {text!r} is not a size; expected an int, -1 or 'auto'.") from None
