from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch

from stratagem.environments.cluster_environment import ClusterEnvironment
from stratagem.launchers import InProcessLauncher, Launcher
from stratagem.strategies.single_process import SingleProcessCollectives
from stratagem.strategies.strategy import Strategy, StrategyOptions

if TYPE_CHECKING:
    from typing_extensions import Unpack


class SingleDeviceStrategy(SingleProcessCollectives, Strategy):
    """One process on one device. Collectives are identities."""

    one_device_name: ClassVar[str] = "single_device"
    """The registered name a run on several devices is refused under."""

    several_devices_instead: ClassVar[str] = "a parallel strategy such as 'ddp'"
    """What that refusal offers instead, besides one device."""

    def __init__(
        self, device: torch.device | str | int | None = None, **strategy_options: Unpack[StrategyOptions]
    ) -> None:
        super().__init__(**strategy_options)
        self._device = torch.device(device) if device is not None else None
        self._launcher = InProcessLauncher()

    def configure_placement(
        self, *, devices: list[torch.device], num_nodes: int, cluster_environment: ClusterEnvironment
    ) -> None:
        if len(devices) * num_nodes != 1:
            raise ValueError(
                f"strategy={self.one_device_name!r} runs on exactly one device, but devices={len(devices)} and "
                f"num_nodes={num_nodes} ask for {len(devices) * num_nodes}. Use devices=1, num_nodes=1, or "
                f"{self.several_devices_instead}."
            )
        if self._device is None:
            self._device = devices[0]

    def complete_configuration(self) -> None:
        # The type of the devices the accelerator makes: its own, except where a test stand-in computes elsewhere.
        if self._device is not None and self._device.type != self.accelerator.get_device(0).type:
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

    def __repr__(self) -> str:
        return f"SingleDeviceStrategy(device={str(self.root_device)!r})"
