"""HorovodStrategy: one process per device; horovod averages the gradients and broadcasts the start state.

stratagem starts the ranks (its launcher) and joins them in a ``torch.distributed`` group, which carries
stratagem's own collectives (metrics, checkpoint coordination). Over that group rank 0 hands every rank
its slot in horovod's Gloo rendezvous, which it serves, and each rank calls ``hvd.init()``: from then on
horovod does what it does under ``horovodrun``:

- :meth:`setup_module` broadcasts rank 0's parameters and buffers (``hvd.broadcast_parameters``);
- :meth:`setup_optimizers` broadcasts rank 0's optimizer state when it has one
  (``hvd.broadcast_optimizer_state``) and wraps the optimizer in ``hvd.DistributedOptimizer``, whose
  backward hooks average the gradients, once per ``accumulate_grad_batches`` backward passes
  (``backward_passes_per_step``), optionally compressed to fp16 on the wire.

The module is not wrapped: every rank holds the whole replicated model, so checkpoints are rank 0's
weights (written by rank 0) and load under any strategy.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

from stratagem.strategies import ParallelOptions, ParallelStrategy, TakesLoopSettings
from stratagem_horovod.environment import HorovodrunEnvironment
from stratagem_horovod.options import (
    check_compression,
    check_gloo_iface,
    check_horovod_installed,
    check_predivide_factor,
)
from stratagem_horovod.rendezvous import (
    Slot,
    horovod_variables,
    restore_variables,
    set_variables,
    start_rendezvous_server,
)

if TYPE_CHECKING:
    from horovod.runner.http.http_server import RendezvousServer
    from typing_extensions import Unpack


class HorovodStrategy(ParallelStrategy, TakesLoopSettings):
    """Data-parallel training with horovod's ``DistributedOptimizer`` over Gloo.

    - ``compression``: ``"none"`` or ``"fp16"`` (gradients cast to fp16 for the all-reduce).
    - ``gradient_predivide_factor``: horovod's split of the averaging around the sum (1.0: after).
    - ``gloo_iface``: the network interface horovod's Gloo uses; ``None`` means ``"lo"`` on one node
      and ``HOROVOD_GLOO_IFACE`` on several.
    """

    max_optimizers: ClassVar[int | None] = 1

    def __init__(
        self,
        *,
        compression: Literal["none", "fp16"] = "none",
        gradient_predivide_factor: float = 1.0,
        gloo_iface: str | None = None,
        **parallel_options: Unpack[ParallelOptions],
    ) -> None:
        check_horovod_installed()
        self.compression = check_compression(compression)
        self.gradient_predivide_factor = check_predivide_factor(gradient_predivide_factor)
        self.gloo_iface = check_gloo_iface(gloo_iface)
        super().__init__(**parallel_options)
        self._server: RendezvousServer | None = None
        self._replaced_variables: dict[str, str | None] = {}
        self._horovod_initialized = False
        self._synchronized: set[int] = set()
        self._original_of: dict[int, Optimizer] = {}

    def complete_configuration(self) -> None:
        if self.precision.param_dtype == torch.bfloat16:
            raise ValueError(
                f"HorovodStrategy cannot run precision={self.precision!r}: its parameters are bfloat16, and "
                "horovod 0.28.1's PyTorch collectives refuse bfloat16 tensors. Use 'bf16-mixed' (fp32 parameters, "
                "bf16 compute), '16-true' or '32-true'."
            )
        if self.num_nodes > 1 and self.gloo_iface is None and not os.environ.get("HOROVOD_GLOO_IFACE"):
            raise ValueError(
                f"HorovodStrategy on num_nodes={self.num_nodes} needs the network interface horovod's Gloo should "
                "use: pass gloo_iface='eth0' (say) or set HOROVOD_GLOO_IFACE; 'lo' only reaches this machine."
            )

    @property
    def _iface(self) -> str:
        return self.gloo_iface or os.environ.get("HOROVOD_GLOO_IFACE") or "lo"

    def setup_environment(self) -> None:
        import horovod.torch as hvd

        super().setup_environment()
        # Under horovodrun its variables are set and its rendezvous runs; otherwise rank 0 serves one.
        if not isinstance(self.cluster_environment, HorovodrunEnvironment):
            self._join_rendezvous_of_rank_zero()
        hvd.init()
        self._horovod_initialized = True
        # horovod's Gloo contexts are made in init; the rendezvous is not needed after every rank is in.
        self.barrier("horovod rendezvous")
        if self._server is not None:
            self._server.stop()
            self._server = None
        if (hvd.rank(), hvd.size()) != (self.global_rank, self.world_size):
            raise RuntimeError(
                f"horovod placed rank {self.global_rank} of {self.world_size} at rank {hvd.rank()} of {hvd.size()}; "
                "its rendezvous and stratagem's ranks disagree."
            )

    def _join_rendezvous_of_rank_zero(self) -> None:
        hostnames: list[Any] = [None] * self.world_size
        with self.collective("all_gather_object of the ranks' host names (horovod rendezvous)"):
            dist.all_gather_object(hostnames, socket.gethostname())
        offer: tuple[int, list[Slot]] | None = None
        if self.is_global_zero:
            self._server, port, slots = start_rendezvous_server([str(name) for name in hostnames])
            offer = (port, slots)
        port, slots = self.broadcast(offer)
        address = self._environment.main_address
        self._replaced_variables = set_variables(horovod_variables(slots[self.global_rank], address, port, self._iface))

    def setup_module(self, module: nn.Module) -> nn.Module:
        import horovod.torch as hvd

        module = super().setup_module(module)
        hvd.broadcast_parameters(module.state_dict(), root_rank=0)
        return module

    def setup_optimizers(self, optimizers: list[Optimizer]) -> list[Optimizer]:
        import horovod.torch as hvd

        optimizers = super().setup_optimizers(optimizers)
        compression = hvd.Compression.fp16 if self.compression == "fp16" else hvd.Compression.none
        wrapped = []
        self._original_of.clear()
        for optimizer in optimizers:
            # A fresh optimizer has no state to share, and horovod would create it by stepping on zero
            # gradients, which moves the parameters under weight decay: broadcast only what rank 0 holds.
            if self.broadcast(bool(optimizer.state)):
                hvd.broadcast_optimizer_state(optimizer, root_rank=0)
            distributed = hvd.DistributedOptimizer(
                optimizer,
                named_parameters=self.module.named_parameters(),
                compression=compression,
                backward_passes_per_step=self.loop_settings.accumulate_grad_batches,
                gradient_predivide_factor=self.gradient_predivide_factor,
            )
            # horovod's optimizer is a new object sharing the user's param_groups, so schedulers made for the
            # user's optimizer still set the learning rate it uses.
            self._original_of[id(distributed)] = optimizer
            wrapped.append(distributed)
        self._synchronized.clear()
        return wrapped

    def _synchronize(self, optimizer: Optimizer) -> None:
        """Wait for the gradient all-reduce of this step (once); what the precision unscales must be the average."""
        if id(optimizer) not in self._synchronized:
            optimizer.synchronize()  # type: ignore[attr-defined]
            self._synchronized.add(id(optimizer))

    def clip_gradients(
        self, optimizer: Optimizer, clip_val: float, algorithm: Literal["norm", "value"] = "norm"
    ) -> torch.Tensor | None:
        self._synchronize(optimizer)
        return super().clip_gradients(optimizer, clip_val, algorithm)

    def optimizer_step(self, optimizer: Optimizer) -> Any:
        self._synchronize(optimizer)
        self._synchronized.discard(id(optimizer))
        with optimizer.skip_synchronize():  # type: ignore[attr-defined]
            result = super().optimizer_step(optimizer)
        original = self._original_of.get(id(optimizer))
        if original is not None:
            # torch's LR schedulers learn that their optimizer stepped from this flag, set by the step() they
            # patch on the user's optimizer; the step ran on horovod's copy, so they would warn of a wrong order.
            original._opt_called = True  # type: ignore[attr-defined]
        return result

    def zero_grad(self, optimizer: Optimizer) -> None:
        # A step skipped for a non-finite gradient norm (Trainer(nonfinite="skip")) synchronised for clipping and
        # never stepped: the next step's gradients must be synchronised again.
        self._synchronized.discard(id(optimizer))
        # horovod's DistributedOptimizer.zero_grad takes no set_to_none; torch's default sets them to None.
        optimizer.zero_grad()

    def teardown(self) -> None:
        if self._horovod_initialized:
            import horovod.torch as hvd

            hvd.shutdown()
            self._horovod_initialized = False
        if self._server is not None:
            self._server.stop()
            self._server = None
        restore_variables(self._replaced_variables)
        self._replaced_variables = {}
        super().teardown()

    def __repr__(self) -> str:
        return f"HorovodStrategy(compression={self.compression!r}, devices={self.num_processes})"
