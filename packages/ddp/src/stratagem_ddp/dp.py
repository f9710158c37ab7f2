"""DataParallelStrategy: one process drives several CUDA GPUs with torch.nn.DataParallel."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from stratagem.environments.cluster_environment import ClusterEnvironment
from stratagem.launchers import InProcessLauncher, Launcher
from stratagem.strategies import RefusesManualOptimization, SingleProcessCollectives, Strategy, StrategyOptions

if TYPE_CHECKING:
    from typing_extensions import Unpack

SUPPORTED_PRECISIONS = ("32-true", "64-true")
"""DataParallel replicates the module per forward; the 16-bit plugins' casts and scalers do not follow it."""


class DataParallelStrategy(SingleProcessCollectives, Strategy, RefusesManualOptimization):
    """Each batch is split across the GPUs of one process and the replicas' outputs gathered on the first.

    Collectives are identities (there is one rank). The training loss the replicas return is
    averaged. Only CUDA, one node, and 32/64-bit precision: prefer ``ddp``, which is faster
    on the same GPUs.
    """

    manual_optimization_unsupported = (
        "DataParallel runs training_step once per GPU, in a replica of the module, so a backward or optimizer step "
        "called there would run once per replica"
    )

    def __init__(
        self, parallel_devices: list[torch.device] | None = None, **strategy_options: Unpack[StrategyOptions]
    ) -> None:
        super().__init__(**strategy_options)
        self.parallel_devices = parallel_devices
        self._launcher = InProcessLauncher()

    def configure_placement(
        self, *, devices: list[torch.device], num_nodes: int, cluster_environment: ClusterEnvironment
    ) -> None:
        if num_nodes != 1:
            raise ValueError(f"strategy='dp' runs in one process on one machine, but num_nodes={num_nodes}; use 'ddp'.")
        self.parallel_devices = self.parallel_devices or devices

    def complete_configuration(self) -> None:
        if self.accelerator.device_type != "cuda":
            raise ValueError(
                f"strategy='dp' (torch DataParallel) splits batches over several CUDA GPUs in one process, but "
                f"accelerator={self.accelerator.device_type!r}. Use accelerator='cuda', or strategy='ddp' (one process "
                "per device, also on CPU)."
            )
        if self.precision.name not in SUPPORTED_PRECISIONS:
            raise ValueError(
                f"strategy='dp' does not support precision={self.precision.name!r}; expected one of "
                f"{', '.join(map(repr, SUPPORTED_PRECISIONS))}. Use strategy='ddp' for 16-bit precision."
            )

    @property
    def launcher(self) -> Launcher:
        return self._launcher

    @property
    def root_device(self) -> torch.device:
        if not self.parallel_devices:
            raise RuntimeError("DataParallelStrategy has no devices yet; create it with stratagem.resolve().")
        return self.parallel_devices[0]

    def setup_module(self, module: nn.Module) -> nn.Module:
        module = super().setup_module(module)
        device_ids = [device.index for device in self.parallel_devices or []]
        self._model = nn.DataParallel(module, device_ids=device_ids, output_device=self.root_device.index)
        return self._model

    def run_step(self, step_name: str, *args: Any) -> Any:
        output = super().run_step(step_name, *args)
        return _mean_of_replicas(output) if step_name == "training_step" else output

    def __repr__(self) -> str:
        return f"DataParallelStrategy(devices={[str(d) for d in self.parallel_devices or []]})"


def _mean_of_replicas(output: Any) -> Any:
    """DataParallel gathers each replica's scalar loss into a vector; the step's loss is their mean."""
    if isinstance(output, torch.Tensor) and output.dim() == 1:
        return output.mean()
    if isinstance(output, dict) and isinstance(output.get("loss"), torch.Tensor) and output["loss"].dim() == 1:
        return {**output, "loss": output["loss"].mean()}
    return output
