"""Rehearse one rank of a cluster job in this process: torch's fake process group, the module on the meta device,
the strategy's real setup; then count that rank's real shards. Nothing is allocated and nothing is sent."""

from __future__ import annotations

import contextlib
import math
import resource
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import nn

from stratagem.planning.footprint import _bytes, _meta_copy, _optimizer_states_per_element
from stratagem.planning.layouts import coordinates, text
from stratagem.precision import Precision
from stratagem.strategies.capabilities import RehearsesSetup
from stratagem.strategies.strategy import Strategy


@dataclass(frozen=True)
class RankRehearsal:
    """What one rank held once the strategy's setup ran on the fake process group (bytes)."""

    rank: int
    coordinates: dict[str, int]
    parameter_bytes: int
    gradient_bytes: int
    optimizer_state_bytes: int
    largest_shard: tuple[str, tuple[int, ...], tuple[int, ...]] | None
    """The parameter with the largest local piece: its name, its whole shape and this rank's shape."""
    problems: list[str] = field(default_factory=list)
    """What the real run would hit: an unresolved plan key, a forward that fails once split, a setup error."""

    @property
    def model_state_bytes(self) -> int:
        return self.parameter_bytes + self.gradient_bytes + self.optimizer_state_bytes


@dataclass(frozen=True)
class Rehearsal:
    """The rehearsal of one strategy and layout: the ranks it played, or why it could not."""

    strategy: str
    layout: dict[str, int]
    ranks: list[RankRehearsal] = field(default_factory=list)
    not_rehearsed: str | None = None
    seconds: float = 0.0
    peak_rss_bytes: int = 0
    """This process's peak resident memory after the rehearsal (``getrusage``): the meta build allocates nothing."""

    @property
    def problems(self) -> list[str]:
        seen: dict[str, None] = {}
        for rank in self.ranks:
            seen.update(dict.fromkeys(rank.problems))
        return list(seen)


class _RehearsalRun:
    """Stands where a Trainer stands for the module's ``configure_model``: ``self.device_mesh`` and
    ``self.global_rank`` read the rehearsed rank's mesh and rank (see :class:`stratagem.Module`)."""

    def __init__(self, mesh: Any, rank: int) -> None:
        self.strategy = self
        self.device_mesh = mesh
        self.root_device = torch.device("meta")
        self.global_rank = rank


@contextlib.contextmanager
def fake_process_group(world_size: int, rank: int) -> Iterator[None]:
    """This process as ``rank`` of ``world_size`` on torch's ``"fake"`` backend, whose collectives return at once."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("a process group exists in this process already; rehearse in a process without one")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def rehearse(
    module: nn.Module,
    name: str,
    strategy: Strategy,
    layout: Mapping[str, int],
    ranks: list[int],
    precision: Precision | None = None,
    example: Any = None,
) -> Rehearsal:
    """Play each of ``ranks`` of ``layout`` in turn: build ``module`` on the meta device with that rank's mesh,
    run its forward on ``example`` once its own plan split it over ``tp > 1``, apply ``strategy``'s setup, count
    its shards."""
    import time

    start = time.perf_counter()
    layout = dict(layout)
    if not isinstance(strategy, RehearsesSetup):
        return Rehearsal(
            name,
            layout,
            not_rehearsed=f"{type(strategy).__name__} does not say how to apply its setup on the meta device "
            "(it does not implement stratagem.strategies.RehearsesSetup)",
        )
    problem = _unbuildable(layout)
    if problem is not None:
        return Rehearsal(name, layout, not_rehearsed=problem)
    # The forward runs on the first rank only: its shapes are every rank's, and torch keeps state keyed by mesh
    # across process groups that makes a second group's forward resolve the first one's (2.13). Without tensor
    # parallelism nothing is split before the strategy's setup: the plan's own forward ran that model already.
    forward = example if layout.get("tp", 1) > 1 else None
    played = [
        _rehearse_rank(module, strategy, layout, rank, precision or Precision(), forward if index == 0 else None)
        for index, rank in enumerate(ranks)
    ]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return Rehearsal(name, layout, played, seconds=time.perf_counter() - start, peak_rss_bytes=peak)


@dataclass(frozen=True)
class TensorParallelSplit:
    """Which parameter elements the module's own tensor-parallel plan splits, measured at one ``tp``."""

    split_elements: int
    whole_elements: int
    problems: list[str] = field(default_factory=list)

    def share(self, tp: int) -> float:
        """The share of the parameter elements one of ``tp`` tensor-parallel ranks holds (1.0: nothing split)."""
        if not self.whole_elements:
            return 1.0
        return (self.whole_elements - self.split_elements + self.split_elements / tp) / self.whole_elements


def tensor_parallel_split(module: nn.Module, precision: Precision | None, tp: int) -> TensorParallelSplit:
    """Build ``module`` on the meta device as rank 0 of a ``tp``-rank tensor-parallel group (the fake process
    group) and see which parameters its own plan split; a plan that splits a tensor evenly over ``tp`` ranks splits
    it over every divisor of ``tp`` the same way."""
    layout = {"pp": 1, "dp_replicate": 1, "dp_shard": 1, "tp": tp}
    built, problems = _build_rank(module, layout, 0, precision or Precision())
    if built is None:
        return TensorParallelSplit(0, 0, problems)
    parameters = list(built.parameters())
    split = sum(parameter.numel() for parameter in parameters if _local(parameter).numel() < parameter.numel())
    return TensorParallelSplit(split, sum(parameter.numel() for parameter in parameters), problems)


def sample_ranks(layout: Mapping[str, int], all_ranks: bool) -> list[int]:
    """Rank 0 alone, or with ``all_ranks`` the first and last rank and the last rank of the first group of each
    dimension: where uneven shards and the mesh's corners show."""
    world = math.prod(layout.values())
    if not all_ranks:
        return [0]
    chosen = {0, world - 1}
    stride = 1
    for name in reversed(list(layout)):
        chosen.add((layout[name] - 1) * stride)
        stride *= layout[name]
    return sorted(chosen)


def _unbuildable(layout: Mapping[str, int]) -> str | None:
    from stratagem.mesh import MeshLayout

    known = set(MeshLayout().dim_names)
    missing = [f"{name}={size}" for name, size in layout.items() if size > 1 and name not in known]
    if missing:
        return f"stratagem.mesh.MeshLayout has no dimension for {', '.join(missing)} yet"
    return None


def _rehearse_rank(
    module: nn.Module, strategy: Strategy, layout: Mapping[str, int], rank: int, precision: Precision, example: Any
) -> RankRehearsal:
    built, problems = _build_rank(module, layout, rank, precision, example, strategy)
    if built is None:
        return RankRehearsal(rank, coordinates(layout, rank), 0, 0, 0, None, problems)
    trainable = [parameter for parameter in built.parameters() if parameter.requires_grad]
    notes: list[str] = []
    states = _optimizer_states_per_element(built, notes)
    gradient_bytes = sum(_bytes(_local(parameter)) for parameter in trainable)
    largest = max(built.named_parameters(), key=lambda item: _local(item[1]).numel(), default=None)
    shard = None
    if largest is not None:
        shard = (_unwrapped_name(largest[0]), tuple(largest[1].shape), tuple(_local(largest[1]).shape))
    return RankRehearsal(
        rank,
        coordinates(layout, rank),
        parameter_bytes=sum(_bytes(_local(parameter)) for parameter in built.parameters()),
        gradient_bytes=gradient_bytes,
        optimizer_state_bytes=int(states * gradient_bytes),
        largest_shard=shard,
        problems=problems,
    )


def _build_rank(
    module: nn.Module,
    layout: Mapping[str, int],
    rank: int,
    precision: Precision,
    example: Any = None,
    strategy: Strategy | None = None,
) -> tuple[nn.Module | None, list[str]]:
    """The module as ``rank`` holds it: built on the meta device with that rank's mesh, then set up by
    ``strategy`` (when given); ``None`` and the problems when a step fails."""
    from stratagem.mesh import MeshLayout

    problems: list[str] = []
    world = math.prod(layout.values())
    mesh_layout = MeshLayout(**{name: layout.get(name, 1) for name in MeshLayout().dim_names})
    with fake_process_group(world, rank):
        mesh, _ = mesh_layout.build("cpu")
        built = _meta_copy(module)
        if hasattr(built, "_trainer"):
            cast(Any, built)._trainer = _RehearsalRun(mesh, rank)
        configure_model = getattr(built, "configure_model", None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                if callable(configure_model):
                    with torch.device("meta"), precision.module_init_context():
                        configure_model()
            except Exception as error:  # the user's configure_model or its tensor-parallel plan: the real run's error
                return None, [f"configure_model failed on rank {rank} ({text(layout)}): {_error(error)}"]
        # torch warns, and goes on without the layer split, when a plan key matches no submodule.
        unresolved = {_first_line(str(warning.message)) for warning in caught if "plan" in str(warning.message)}
        problems += [f"tensor-parallel plan: {message}" for message in sorted(unresolved)]
        if example is not None:
            failure = _split_forward_failure(built, example, precision)
            if failure is not None:  # indivisible heads and the like: shapes the split layers no longer fit
                problems.append(f"forward fails once split ({text(layout)}): {_error(failure)}")
        if strategy is not None:
            assert isinstance(strategy, RehearsesSetup)
            try:
                built = strategy.rehearse_setup(built, mesh)
            except Exception as error:  # fully_shard refusing the module, a mesh the strategy cannot use
                return None, [*problems, f"{type(strategy).__name__} setup failed ({text(layout)}): {_error(error)}"]
        if hasattr(built, "_trainer"):
            cast(Any, built)._trainer = None
    return built, problems


def _split_forward_failure(module: nn.Module, example: Any, precision: Precision) -> Exception | None:
    """What one forward of ``example`` raises, ``None`` when it runs. Blocks alike (one class, the same parameter
    shapes) see the same shapes: the forward runs through the first alone, and through all of them only to confirm
    a failure (a model that counts its blocks may fail without the others)."""
    from stratagem.planning.workload import _call

    def failure() -> Exception | None:
        try:
            with torch.no_grad(), precision.forward_context():
                _call(module, _meta(example))
        except Exception as error:  # the caller reports it as the real run's problem
            return error
        return None

    with _first_of_alike_blocks(module) as cut:
        found = failure()
    return found if found is None or not cut else failure()


@contextlib.contextmanager
def _first_of_alike_blocks(module: nn.Module) -> Iterator[bool]:
    """``module`` with its repeated blocks cut to the first while inside, when they are alike; yields whether."""
    from stratagem.planning.workload import blocks_container

    container = blocks_container(module)
    blocks = dict(container._modules) if container is not None else {}
    kinds = {
        (type(block), tuple((name, tuple(parameter.shape)) for name, parameter in block.named_parameters()))
        for block in blocks.values()
        if block is not None
    }
    if container is None or len(kinds) != 1:
        yield False
        return
    first = next(iter(blocks))
    container._modules = {first: blocks[first]}
    try:
        yield True
    finally:
        container._modules = blocks


def _meta(example: Any) -> Any:
    from stratagem.planning.footprint import _to_meta

    return _to_meta(example)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _unwrapped_name(name: str) -> str:
    return name.replace("_checkpoint_wrapped_module.", "").replace("module.", "", 1)


def _error(error: BaseException) -> str:
    return f"{type(error).__name__}: {_first_line(str(error))}"


def _first_line(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else ""
