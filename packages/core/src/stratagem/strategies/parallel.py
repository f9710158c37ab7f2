from __future__ import annotations

import contextlib
import itertools
import os
from abc import ABC
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, cast

import torch
import torch.distributed as dist
from torch.optim import Optimizer

from stratagem.accelerators import Accelerator
from stratagem.checkpoint_io import CheckpointIO, PathLike
from stratagem.checkpoint_io.staging import rank_zero_writes
from stratagem.environments.cluster_environment import ClusterEnvironment
from stratagem.launchers import Launcher, check_start_method, create_launcher
from stratagem.launchers.rendezvous import check_placement
from stratagem.mesh import MeshLayout
from stratagem.precision import Precision
from stratagem.strategies._backend_threads import wait_for_idle_gloo_workers
from stratagem.strategies._network import choose_gloo_interface
from stratagem.strategies._process_group import ArrivalLog, join, join_timeout
from stratagem.strategies._process_group_options import (
    check_backend_fits_device,
    check_process_group_backend,
    check_timeout,
)
from stratagem.strategies.collective_arguments import reduce_operation
from stratagem.strategies.gradient_norm import clip_gradients_by_norm, has_distributed_tensors
from stratagem.strategies.strategy import ReduceOp, Strategy, StrategyOptions

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

DEFAULT_TIMEOUT = timedelta(minutes=30)

# Ranks that outlive one run (a re-run script, torchrun) join the next run's group through the
# same store, which still holds the keys of the last rendezvous; reading those, a rank dialled
# its peer's closed port and the run hung. Every rank counts its rendezvous in the same order,
# so the count gives each one fresh keys.
_rendezvous_count = itertools.count()

_REDUCE_OPS = {
    "sum": dist.ReduceOp.SUM,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
}


class ParallelOptions(StrategyOptions, total=False):
    """The options every :class:`ParallelStrategy` takes, with the defaults of :meth:`ParallelStrategy.__init__`.

    A backend declares its own options and takes these as ``**parallel_options: Unpack[ParallelOptions]``
    (passed on to ``super().__init__``), so that they are declared once, here and on the base class.
    """

    parallel_devices: list[torch.device] | None
    cluster_environment: ClusterEnvironment | None
    process_group_backend: str | None
    timeout: timedelta | float
    start_method: str


PARALLEL_OPTIONS = ParallelOptions.__optional_keys__


def split_parallel_options(options: dict[str, Any]) -> tuple[ParallelOptions, dict[str, Any]]:
    """``options`` cut in two: those of :class:`ParallelOptions`, and the rest (a backend's catch-all)."""
    parallel = {name: value for name, value in options.items() if name in PARALLEL_OPTIONS}
    rest = {name: value for name, value in options.items() if name not in PARALLEL_OPTIONS}
    return cast(ParallelOptions, parallel), rest


class ParallelStrategy(Strategy, ABC):
    """Several processes, one per device, joined in a ``torch.distributed`` process group.

    Subclasses choose the launcher and how the module is wrapped; process-group setup and
    the collectives live here.
    """

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        precision: Precision | None = None,
        checkpoint_io: CheckpointIO | None = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        process_group_backend: str | None = None,
        timeout: timedelta | float = DEFAULT_TIMEOUT,
        start_method: str = "popen",
    ) -> None:
        super().__init__(accelerator=accelerator, precision=precision, checkpoint_io=checkpoint_io)
        self.start_method = check_start_method(start_method)
        self._launcher: Launcher | None = None
        self.parallel_devices = parallel_devices
        self.cluster_environment = cluster_environment
        self._process_group_backend = check_process_group_backend(process_group_backend)
        self.timeout = check_timeout(timeout)
        self.num_nodes = 1
        self._created_process_group = False
        self._arrivals: ArrivalLog | None = None
        # A subclass that composes parallelisms sets a layout here; without one, every rank is a data rank.
        self._mesh_layout: MeshLayout | None = None
        self._layout_mesh: DeviceMesh | None = None
        self._layout_data_parallel_mesh: DeviceMesh | None = None

    def configure_placement(
        self, *, devices: list[torch.device], num_nodes: int, cluster_environment: ClusterEnvironment
    ) -> None:
        self.parallel_devices = self.parallel_devices or devices
        self.cluster_environment = self.cluster_environment or cluster_environment
        self.num_nodes = num_nodes
        check_backend_fits_device(self._process_group_backend, self.accelerator.device_type)
        self.cluster_environment.validate_settings(len(self.parallel_devices), num_nodes)
        self._set_world_ranks()
        check_placement(self.cluster_environment, len(self.parallel_devices), num_nodes)
        if self._mesh_layout is not None:
            self._mesh_layout = self._mesh_layout.resolved(len(self.parallel_devices) * num_nodes)
        join_timeout()

    @property
    def launcher(self) -> Launcher:
        """Started by ``start_method``: ``"popen"`` re-runs the command per rank; the others use multiprocessing."""
        if self._launcher is None:
            self._launcher = create_launcher(self.start_method, self._environment, self.num_processes, self.num_nodes)
        return self._launcher

    def _set_world_ranks(self) -> None:
        # Only environments without a scheduler (local) take these; others read their variables.
        environment = self._environment
        environment.set_global_rank(self.node_rank * self.num_processes + self.local_rank)
        environment.set_world_size(self.num_nodes * self.num_processes)

    @property
    def process_group_backend(self) -> str:
        return self._process_group_backend or self.accelerator.process_group_backend

    @property
    def num_processes(self) -> int:
        return len(self.parallel_devices) if self.parallel_devices else 0

    @property
    def _environment(self) -> ClusterEnvironment:
        if self.cluster_environment is None:
            raise RuntimeError(f"{type(self).__name__} has no cluster environment; create it with stratagem.resolve().")
        return self.cluster_environment

    @property
    def global_rank(self) -> int:
        return self._environment.global_rank() if self.cluster_environment else 0

    @property
    def local_rank(self) -> int:
        return self._environment.local_rank() if self.cluster_environment else 0

    @property
    def node_rank(self) -> int:
        return self._environment.node_rank() if self.cluster_environment else 0

    @property
    def world_size(self) -> int:
        return self._environment.world_size() if self.cluster_environment else 1

    @property
    def root_device(self) -> torch.device:
        if not self.parallel_devices:
            raise RuntimeError(f"{type(self).__name__} has no devices yet; create it with stratagem.resolve().")
        return self.parallel_devices[self.local_rank]

    @property
    def mesh_layout(self) -> MeshLayout | None:
        """The parallel layout this strategy runs (resolved against the world size once configured), or ``None``
        when every rank is a data-parallel rank."""
        return self._mesh_layout

    @property
    def device_mesh(self) -> DeviceMesh | None:
        if self._mesh_layout is None:
            return None
        if self._layout_mesh is None:
            raise RuntimeError(f"{type(self).__name__}.device_mesh exists once setup_environment() ran in the worker.")
        return self._layout_mesh

    @property
    def data_parallel_group(self) -> Any:
        return None if self._layout_data_parallel_mesh is None else self._layout_data_parallel_mesh.get_group()

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int] | None:
        layout = self._mesh_layout
        if layout is not None:
            # Ranks of one tensor-parallel group compute on the same batch.
            return {"num_replicas": layout.data_parallel_size, "rank": layout.data_parallel_rank(self.global_rank)}
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    def setup_environment(self) -> None:
        self._set_world_ranks()
        super().setup_environment()
        self.init_dist_connection()
        if self._mesh_layout is not None:
            self._layout_mesh, self._layout_data_parallel_mesh = self._mesh_layout.build(self.root_device.type)

    def init_dist_connection(self) -> None:
        """Join the process group described by the cluster environment (no-op if already joined).

        The ranks meet within the join timeout (``STRATAGEM_JOIN_TIMEOUT``, see
        :func:`~stratagem.strategies._process_group.join`); :attr:`timeout` bounds the collectives after.
        """
        if dist.is_initialized():
            return
        environment = self._environment
        address, port = environment.main_address, environment.main_port
        os.environ["MASTER_ADDR"] = address
        os.environ["MASTER_PORT"] = str(port)
        rank, world_size = environment.global_rank(), environment.world_size()
        if "gloo" in self.process_group_backend:
            choose_gloo_interface(address, announce=environment.local_rank() == 0)
        store = join(
            address,
            port,
            rank,
            world_size,
            prefix=f"stratagem/rendezvous_{next(_rendezvous_count)}",
            timeout=join_timeout(),
            layout=f"num_nodes={self.num_nodes}, devices={self.num_processes} (world size {world_size})",
            store_outlives_workers=environment.store_outlives_workers,
        )
        # Once every rank joined, the store's users (the backend's own connections, subgroups, the arrival log)
        # are bounded like collectives.
        for layer in (store, store.underlying_store):
            layer.set_timeout(self.timeout)
        dist.init_process_group(
            self.process_group_backend, store=store, rank=rank, world_size=world_size, timeout=self.timeout
        )
        self._created_process_group = True
        self._arrivals = ArrivalLog(store, rank, world_size, self.timeout)

    def reduce(self, tensor: Any, op: ReduceOp = "mean", *, group: Any = None, reduce_op: Any = None) -> Any:
        op = reduce_operation(op, reduce_op)
        if not isinstance(tensor, torch.Tensor) or not _distributed_ready():
            return tensor
        result = tensor.detach().clone()
        with self.collective(f"all_reduce (reduce with op={op!r})"):
            dist.all_reduce(result, op=_REDUCE_OPS["sum" if op == "mean" else op], group=group)
        if op == "mean":
            size = dist.get_world_size(group)
            result = result / size if result.is_floating_point() else result // size
        return result

    def all_gather(self, tensor: torch.Tensor, sync_grads: bool = False, *, group: Any = None) -> torch.Tensor:
        if not _distributed_ready():
            return tensor.unsqueeze(0)
        if sync_grads:
            from torch.distributed.nn.functional import all_gather as differentiable_all_gather

            with self.collective("all_gather (sync_grads=True)"):
                return torch.stack(differentiable_all_gather(tensor.contiguous(), group=group or dist.group.WORLD))
        gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
        with self.collective("all_gather"):
            dist.all_gather(gathered, tensor.contiguous(), group=group)
        return torch.stack(gathered)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if not _distributed_ready():
            return obj
        if isinstance(obj, torch.Tensor):
            tensor = obj.contiguous()
            with self.collective(f"broadcast (of a tensor from rank {src})"):
                dist.broadcast(tensor, src)
            return tensor
        holder = [obj]
        with self.collective(f"broadcast_object_list (of a {type(obj).__name__} from rank {src})"):
            dist.broadcast_object_list(holder, src)
        return holder[0]

    def barrier(self, name: str | None = None) -> None:
        if not _distributed_ready():
            return
        with self.collective("barrier" if name is None else f"barrier {name!r}"):
            if self.process_group_backend == "nccl":
                dist.barrier(device_ids=[self.root_device.index or 0])
            else:
                dist.barrier()

    def gather_step_outcome(self, outcome: int) -> list[int]:
        if not _distributed_ready():
            # Collectives of the strategy's own (not torch.distributed's), if any.
            return super().gather_step_outcome(outcome)
        # One all_reduce of one slot per rank, the cheapest exchange gloo and NCCL have (an all_gather costs half as
        # much again). Made on every step, it leaves out the arrival log's store write, which would double its cost;
        # every rank leaves it out alike, so the log's counts still agree.
        outcomes = torch.zeros(dist.get_world_size(), dtype=torch.int32, device=self.root_device)
        outcomes[dist.get_rank()] = outcome
        try:
            dist.all_reduce(outcomes)
        except RuntimeError:
            with self.collective("all_reduce (of the training step's outcome, after training_step)"):
                raise
        if self._arrivals is not None:
            self._arrivals.batch_checked()
        return outcomes.tolist()

    @contextlib.contextmanager
    def collective(self, description: str) -> Iterator[None]:
        """Context around a collective: its failure or timeout is re-raised naming ``description`` and this
        rank, the ranks that were lost, and on a timeout the ranks that never arrived, where the rendezvous
        store can tell."""
        arrivals = self._arrivals if _distributed_ready() else None
        if arrivals is not None:
            arrivals.enter(description)
        try:
            yield
        except RuntimeError as error:
            timed_out = "timed out" in str(error).lower() or "timeout" in str(error).lower()
            what = f"did not complete within timeout={self.timeout}" if timed_out else "failed"
            absent = ""
            if arrivals is not None:
                # A timeout is explained by where the others are; a failure (a connection closed) by who is gone.
                absent = arrivals.absent() if timed_out else arrivals.lost()
                absent = f"\n{absent}" if absent else ""
            raise RuntimeError(
                f"The collective {description} {what} on rank {self.global_rank}: {error}{absent}\n"
                "A collective fails when another rank died, and times out when another rank never reached it "
                "(for example, it runs different code or is stuck, or its host left the network)."
            ) from error

    def clip_gradients(
        self, optimizer: Optimizer, clip_val: float, algorithm: Literal["norm", "value"] = "norm"
    ) -> torch.Tensor | None:
        parameters = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if algorithm == "value" or not has_distributed_tensors([p.grad for p in parameters]):
            return super().clip_gradients(optimizer, clip_val, algorithm)
        self.precision.unscale_gradients(optimizer)
        return clip_gradients_by_norm(parameters, clip_val)

    # -- checkpoints ------------------------------------------------------------------------

    def save_checkpoint(self, path: PathLike, state: dict[str, Any]) -> None:
        # After the run the group this strategy made is destroyed: with nothing left to tell the other ranks
        # when the file is there, rank 0 writes what it holds alone (a collective IO then writes as one process).
        if not _distributed_ready() and not self.is_global_zero:
            return
        super().save_checkpoint(path, state)

    @contextlib.contextmanager
    def _joined_process_group(self) -> Iterator[None]:
        """The run's process group, for work on state sharded over its processes; after the run, joined again.

        Once a run has ended its group is gone, but each process still holds its shards (of the module, of
        the optimizer state): for a collective after the run (``trainer.save_checkpoint`` once ``fit`` has
        returned, called on every rank), the ranks meet again as a run's would and leave once it is done.
        """
        if _distributed_ready():
            yield
            return
        self.init_dist_connection()
        try:
            yield
        finally:
            self._close_arrivals()
            if self._created_process_group:
                self.destroy_process_group()
            wait_for_idle_gloo_workers()
            self._created_process_group = False

    def _require_live_process_group(self, action: str) -> None:
        """Raise, before anything is read or written, when the process group joining the run has ended.

        For strategies whose module or optimizer state is sharded over the processes: after the run the
        shards are out of reach, and each process alone would save an incomplete checkpoint.
        """
        if _distributed_ready():
            return
        raise RuntimeError(
            f"{type(self).__name__} cannot {action} now: its module and optimizer state are sharded over the run's "
            "processes, and the process group that joins them ended with the run. Save while the run is live: call "
            "trainer.save_checkpoint(path) from a callback or hook (on_train_end, say, on every rank), or let "
            "ModelCheckpoint save."
        )

    def write_on_rank_zero(self, write: Callable[[], None], description: str) -> None:
        if not _distributed_ready():
            super().write_on_rank_zero(write, description)
            return
        rank_zero_writes(self, write, description)

    def teardown(self) -> None:
        super().teardown()
        self._close_arrivals()
        if dist.is_available() and dist.is_initialized():
            # A group initialised before this strategy set up (by the user's script) is the user's: it
            # outlives the run. Either way the run's last collectives must be released before the
            # process may exit.
            if self._created_process_group:
                self.destroy_process_group()
            wait_for_idle_gloo_workers()
        self._created_process_group = False
        self._layout_mesh = self._layout_data_parallel_mesh = None
        if self.cluster_environment is not None:
            self.cluster_environment.teardown()

    def _close_arrivals(self) -> None:
        if self._arrivals is not None:
            self._arrivals.close()
        self._arrivals = None

    def destroy_process_group(self) -> None:
        """Destroy the default process group this strategy created, with whatever the backend keeps of it."""
        dist.destroy_process_group()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(devices={self.num_processes}, num_nodes={self.num_nodes}, "
            f"process_group_backend={self._process_group_backend or 'auto'!r})"
        )


def _distributed_ready() -> bool:
    return dist.is_available() and dist.is_initialized()
