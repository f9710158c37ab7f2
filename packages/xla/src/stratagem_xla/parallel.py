"""``xla`` (and ``xla_debug``): one process per XLA device, gradients all-reduced by ``xm.optimizer_step``."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.optim import Optimizer

from stratagem.accelerators import Accelerator
from stratagem.checkpoint_io import CheckpointIO
from stratagem.environments import ClusterEnvironment
from stratagem.launchers import Launcher
from stratagem.precision import Precision
from stratagem.strategies import DefersHostReads, FeedsBatchesToDevice, ParallelStrategy, ReduceOp
from stratagem.strategies.collective_arguments import reduce_operation
from stratagem_xla import stepping
from stratagem_xla.accelerator import XLAAccelerator
from stratagem_xla.checkpoint_io import XLACheckpointIO
from stratagem_xla.environment import XLAEnvironment
from stratagem_xla.launcher import XLALauncher
from stratagem_xla.precision_support import check_precision


class XLAStrategy(ParallelStrategy, FeedsBatchesToDevice, DefersHostReads):
    """Data parallel over the XLA devices of a host (TPU cores), one replica process per device.

    Replicas are started by ``xmp.spawn`` (:class:`~stratagem_xla.launcher.XLALauncher`) and numbered by the
    XLA runtime (:class:`~stratagem_xla.environment.XLAEnvironment`); they join torch.distributed's ``xla``
    backend (``init_method="xla://"``). Each optimizer step all-reduces the gradients (``xm.optimizer_step``);
    batches come through torch_xla's parallel loader, which ends each step's traced graph. Collectives use XLA's own
    (``xm.all_reduce``, ``xm.all_gather``, ``xm.collective_broadcast``, ``xm.rendezvous``). ``devices`` must be
    every device of the host: ``xmp.spawn`` starts one replica per device and cannot start fewer but one.
    ``debug=True`` (``xla_debug``) prints XLA's metrics report in every replica when the run ends.
    """

    # Reading each step's loss on the host would cut XLA's traced graph and wait for the device every step.

    @staticmethod
    def is_available() -> bool:
        from stratagem_xla import runtime

        return runtime.load_problem() is None

    @staticmethod
    def unavailable_reason() -> str:
        from stratagem_xla import runtime

        return runtime.load_problem() or ""

    strategy_name = "xla"

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        precision: Precision | None = None,
        checkpoint_io: CheckpointIO | None = None,
        parallel_devices: list[torch.device] | None = None,
        debug: bool = False,
        start_method: str = "spawn",
    ) -> None:
        super().__init__(
            accelerator=accelerator or XLAAccelerator(),
            precision=precision,
            checkpoint_io=checkpoint_io or XLACheckpointIO(),
            parallel_devices=parallel_devices,
            cluster_environment=XLAEnvironment(),
        )
        if not isinstance(debug, bool):
            raise TypeError(f"{type(self).__name__}(debug={debug!r}) is not valid; expected True or False.")
        if start_method not in ("spawn", "fork"):
            raise ValueError(
                f"{type(self).__name__}(start_method={start_method!r}) is not valid; xmp.spawn starts replicas with "
                "'spawn' or 'fork'."
            )
        self.debug = debug
        self.xla_start_method = start_method
        self._device: torch.device | None = None

    def configure_placement(
        self, *, devices: list[torch.device], num_nodes: int, cluster_environment: ClusterEnvironment
    ) -> None:
        # The replicas' places come from xmp.spawn and the XLA runtime, not from the connector's environment.
        self.parallel_devices = self.parallel_devices or devices
        self.num_nodes = num_nodes
        available = self.accelerator.device_count()
        if len(self.parallel_devices) not in (1, available):
            raise ValueError(
                f"strategy={self.strategy_name!r} starts one replica per XLA device of the host with xmp.spawn, which "
                f"starts either all of them or one: devices={len(self.parallel_devices)} is neither 1 nor "
                f"{available} (this host's XLA devices). Use devices={available} or devices=1."
            )
        self._environment.set_world_size(num_nodes * len(self.parallel_devices))

    def complete_configuration(self) -> None:
        check_precision(self.precision, self.strategy_name)

    @property
    def launcher(self) -> Launcher:
        if self._launcher is None:
            self._launcher = XLALauncher(self.xla_start_method)
        return self._launcher

    @property
    def root_device(self) -> torch.device:
        if self._device is not None:
            return self._device
        return torch.device("xla", 0)

    @property
    def process_group_backend(self) -> str:
        return "xla"

    def setup_environment(self) -> None:
        self._device = stepping.xla_device()
        self._in_run = True
        self.accelerator.setup_device(self._device)
        if not dist.is_initialized():
            import torch_xla.distributed.xla_backend  # noqa: F401  (registers the "xla" backend)

            dist.init_process_group("xla", init_method="xla://")
            self._created_process_group = True

    # -- collectives, through XLA's own ---------------------------------------------------------

    def reduce(self, tensor: Any, op: ReduceOp = "mean", *, group: Any = None, reduce_op: Any = None) -> Any:
        op = reduce_operation(op, reduce_op)
        if not isinstance(tensor, torch.Tensor) or self.world_size == 1:
            return tensor
        import torch_xla.core.xla_model as xm

        kinds = {"sum": xm.REDUCE_SUM, "mean": xm.REDUCE_SUM, "max": xm.REDUCE_MAX, "min": xm.REDUCE_MIN}
        result = xm.all_reduce(kinds[op], tensor.to(self.root_device), groups=group)
        return result / self.world_size if op == "mean" else result

    def all_gather(self, tensor: torch.Tensor, sync_grads: bool = False, *, group: Any = None) -> torch.Tensor:
        if self.world_size == 1:
            return tensor.unsqueeze(0)
        import torch_xla.core.xla_model as xm

        if sync_grads:
            import torch_xla.core.functions as xf

            return xf.all_gather(tensor.unsqueeze(0).to(self.root_device), dim=0, groups=group)
        return xm.all_gather(tensor.unsqueeze(0).to(self.root_device), dim=0, groups=group)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if self.world_size == 1:
            return obj
        import torch_xla.core.xla_model as xm

        if isinstance(obj, torch.Tensor):
            tensor = obj.to(self.root_device)
            xm.collective_broadcast([tensor], root_ordinal=src)
            return tensor
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        payload = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
        size = self.broadcast(torch.tensor([payload.numel()]), src)
        data = torch.zeros(int(size.item()), dtype=torch.uint8)
        if self.global_rank == src:
            data = payload.clone()
        data = self.broadcast(data, src).cpu()
        return torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=False)

    def barrier(self, name: str | None = None) -> None:
        if self.world_size == 1:
            return
        import torch_xla.core.xla_model as xm

        xm.rendezvous(name or "stratagem_barrier")

    # -- steps ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def module_init_context(self, empty_init: bool | None = None) -> Iterator[None]:
        with stepping.cpu_module_init(self.precision, empty_init):
            yield

    def optimizer_step(self, optimizer: Optimizer) -> Any:
        import torch_xla.core.xla_model as xm

        def step() -> Any:
            xm.reduce_gradients(optimizer)
            return optimizer.step()

        return self.precision.optimizer_step(optimizer, step)

    def device_batches(self, batches: Iterator[Any]) -> Iterator[Any]:
        return stepping.feed(batches, self.root_device)

    def teardown(self) -> None:
        super().teardown()
        if self.debug:
            stepping.print_debug_metrics()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(devices={self.num_processes}, debug={self.debug})"
