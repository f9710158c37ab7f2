"""``xla_fsdp_v2``: one process shards its model over every XLA device with SPMD (``SpmdFullyShardedDataParallel``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from stratagem.accelerators import Accelerator
from stratagem.checkpoint_io import CheckpointIO
from stratagem.environments import ClusterEnvironment
from stratagem.precision import Precision
from stratagem_xla import runtime
from stratagem_xla.precision_support import check_precision
from stratagem_xla.strategy import SingleXLAStrategy
from stratagem_xla.wrapping import auto_wrap_policy, checkpointing_wrapper, module_classes

_NAME = "XLAFSDPv2Strategy"


class XLAFSDPv2Strategy(SingleXLAStrategy):
    """Fully sharded data parallel through XLA's SPMD partitioner, in one process over all of its devices.

    Parameters are sharded over the ``fsdp`` axis of a device mesh (every device on it: shape
    ``(devices, 1)``, axes ``("fsdp", "model")``) and every batch is split along its first dimension over the
    same axis, so the batch size must be a multiple of the device count. The compiler inserts the gathers and
    reduce-scatters FSDP needs. ``auto_wrap_policy``: module classes wrapped as their own FSDP units (each
    transformer block, say); ``activation_checkpointing``: module classes whose activations are recomputed in
    backward. Creating this strategy switches the process's XLA runtime to SPMD for good (torch_xla allows
    that only before the runtime starts). Batches are copied to the devices in the loop's thread (no background
    loader). Checkpoints hold the whole weights (gathered onto the CPU), loadable by any strategy.
    """

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        precision: Precision | None = None,
        checkpoint_io: CheckpointIO | None = None,
        auto_wrap_policy: type[nn.Module] | Iterable[type[nn.Module]] | None = None,
        activation_checkpointing: type[nn.Module] | Iterable[type[nn.Module]] | None = None,
        debug: bool = False,
    ) -> None:
        super().__init__(accelerator=accelerator, precision=precision, checkpoint_io=checkpoint_io, debug=debug)
        _use_spmd()
        self.auto_wrap_classes = module_classes(auto_wrap_policy, "auto_wrap_policy", _NAME)
        self.checkpointed_classes = module_classes(activation_checkpointing, "activation_checkpointing", _NAME)
        self.num_devices = 0
        self._mesh: Any = None

    def configure_placement(
        self, *, devices: list[torch.device], num_nodes: int, cluster_environment: ClusterEnvironment
    ) -> None:
        if num_nodes != 1:
            raise ValueError(
                f"strategy='xla_fsdp_v2' shards over the devices of one process; num_nodes={num_nodes} is not "
                "supported. Use num_nodes=1."
            )
        self.num_devices = len(devices)

    def complete_configuration(self) -> None:
        check_precision(self.precision, "xla_fsdp_v2")

    def setup_environment(self) -> None:
        import numpy as np
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        available = xr.global_runtime_device_count()
        if self.num_devices != available:
            raise ValueError(
                f"strategy='xla_fsdp_v2' shards over every XLA device of the runtime ({available}), but devices="
                f"{self.num_devices} was asked for. Use devices={available} or devices='auto'."
            )
        self._mesh = xs.Mesh(np.arange(available), (available, 1), ("fsdp", "model"))
        super().setup_environment()

    @property
    def mesh(self) -> Any:
        """The device mesh (``torch_xla.distributed.spmd.Mesh``) parameters and batches are sharded over."""
        if self._mesh is None:
            raise RuntimeError("The mesh exists once the run has started (setup_environment).")
        return self._mesh

    def setup_module(self, module: nn.Module) -> nn.Module:
        from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel

        module = self.precision.convert_module(module).to(self.root_device)
        self._module = module
        self._model = SpmdFullyShardedDataParallel(
            module,
            mesh=self.mesh,
            shard_output=_leave_outputs,
            auto_wrap_policy=auto_wrap_policy(self.auto_wrap_classes),
            auto_wrapper_callable=checkpointing_wrapper(SpmdFullyShardedDataParallel, self.checkpointed_classes),
        )
        return self._model

    def device_batches(self, batches: Iterator[Any]) -> Iterator[Any]:
        # Not through the parallel loader: marking the sharding of a batch its thread placed on the device
        # crashed torch_xla 2.9 (a segmentation fault in mark_sharding), and its own input_sharding takes one
        # partition spec for every tensor of a batch whatever their ranks. Each batch is placed and sharded
        # here, after the graph cut the loader would have made, and the pass ends with the cut it makes there.
        import torch_xla

        try:
            for batch in batches:
                torch_xla.sync()
                yield self._shard_batch(self.batch_to_device(batch))
        finally:
            torch_xla.sync()

    def _shard_batch(self, batch: Any) -> Any:
        import torch_xla.distributed.spmd as xs

        if isinstance(batch, torch.Tensor):
            if batch.dim() > 0:
                if batch.shape[0] % self.num_devices:
                    raise ValueError(
                        f"strategy='xla_fsdp_v2' splits each batch over {self.num_devices} devices, but a batch has "
                        f"{batch.shape[0]} rows; use a batch size that is a multiple of {self.num_devices}."
                    )
                xs.mark_sharding(batch, self.mesh, ("fsdp",) + (None,) * (batch.dim() - 1))
            return batch
        if isinstance(batch, dict):
            return {key: self._shard_batch(value) for key, value in batch.items()}
        if isinstance(batch, list | tuple):
            return type(batch)(self._shard_batch(value) for value in batch)
        return batch

    def __repr__(self) -> str:
        return f"XLAFSDPv2Strategy(devices={self.num_devices}, debug={self.debug})"


def _use_spmd() -> None:
    """Switch this process's XLA runtime to SPMD, which must happen before the runtime starts (before any XLA
    tensor exists): torch_xla 2.9 forced into SPMD later was seen to crash in its next graph execution."""
    runtime.require_xla()
    import torch_xla
    import torch_xla.runtime as xr

    if xr.is_spmd():
        return
    if torch_xla._XLAC._xla_runtime_is_initialized():
        raise RuntimeError(
            "strategy='xla_fsdp_v2' needs XLA's SPMD mode, which must be switched on before the XLA runtime starts, "
            "but this process has used an XLA device already. Create the Trainer with xla_fsdp_v2 before anything "
            "touches an XLA device, or run it in a fresh process."
        )
    xr.use_spmd()


def _leave_outputs(output: Any, mesh: Any) -> None:
    # The step's outputs (the loss, logged values) follow from sharded parameters and batches; marking them
    # too would only constrain the partitioner.
    return None
