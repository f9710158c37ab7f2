from __future__ import annotations

from typing import Any

import torch

from stratagem.accelerators import Accelerator
from stratagem.checkpoint_io import CheckpointIO
from stratagem.environments.cluster_environment import ClusterEnvironment
from stratagem.launchers import InProcessLauncher, Launcher
from stratagem.precision import Precision
from stratagem.strategies.collective_arguments import reduce_operation
from stratagem.strategies.strategy import ReduceOp, Strategy


class SingleDeviceStrategy(Strategy):
    """One process on one device. Collectives are identities."""

    def __init__(
        self,
        device: torch.device | str | int | None = None,
        accelerator: Accelerator | None = None,
        precision: Precision | None = None,
        checkpoint_io: CheckpointIO | None = None,
    ) -> None:
        super().__init__(accelerator=accelerator, precision=precision, checkpoint_io=checkpoint_io)
        self._device = torch.device(device) if device is not None else None
        self._launcher = InProcessLauncher()

    def configure_placement(
        self, *, devices: list[torch.device], num_nodes: int, cluster_environment: ClusterEnvironment
    ) -> None:
        if len(devices) * num_nodes != 1:
            raise ValueError(
                f"strategy='single_device' runs on exactly one device, but devices={len(devices)} and "
                f"num_nodes={num_nodes} ask for {len(devices) * num_nodes}. Use devices=1, num_nodes=1, "
                "or a parallel strategy such as 'ddp'."
            )
        if self._device is None:
            self._device = devices[0]

    def complete_configuration(self) -> None:
        if self._device is not None and self._device.type != self.accelerator.device_type:
            raise ValueError(
                f"SingleDeviceStrategy(device={str(self._device)!r}) does not match "
                f"accelerator={self.accelerator.device_type!r}."
            )

    @property
    def launcher(self) -> Launcher:
        return self._launcher

    @property
    def root_device(self) -> torch.device:
        if self._device is None:
            return torch.device("cpu")
        return self._device

    def reduce(self, tensor: Any, op: ReduceOp = "mean", *, group: Any = None, reduce_op: Any = None) -> Any:
        reduce_operation(op, reduce_op)
        return tensor

    def all_gather(self, tensor: torch.Tensor, sync_grads: bool = False, *, group: Any = None) -> torch.Tensor:
        return tensor.unsqueeze(0)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return obj

    def barrier(self, name: str | None = None) -> None:
        return None

    def __repr__(self) -> str:
        return f"SingleDeviceStrategy(device={str(self.root_device)!r})"
