"""One peer of a hivemind swarm, as a stratagem strategy.

A swarm has no launcher and no fixed world size: every peer is a process of its own, started by
hand on any machine, that finds the others through their addresses (``initial_peers``) and trains
with whoever is there. To stratagem each peer is a single-device run (its collectives are this
process's own); the swarm lives in the optimizer step. The peer joins the swarm when ``fit`` has
its optimizer, and leaves it in :meth:`teardown`:

- ``hivemind.Optimizer`` wraps the module's optimizer. Each local step adds this step's gradients
  (``batch_size_per_step`` samples); once the swarm together reached ``target_batch_size`` samples,
  the peers average their gradients and all step (a *collaborative epoch*). With
  ``use_local_updates`` every peer steps alone and the peers average parameters each epoch instead.
- The learning-rate scheduler steps once per collaborative epoch, not per local step (hivemind steps
  it, :class:`~stratagem.strategies.StepsLRSchedulers`), so that a peer that joined late has the swarm's learning rate.
- A peer given ``initial_peers`` downloads the swarm's parameters, optimizer state, scheduler and
  epoch before its first step; the first peer waits for ``min_peers`` before training.
- A checkpoint is an ordinary one (the module's weights, the torch optimizer's state: any strategy
  loads it) plus the collaborative epoch under ``"hivemind"``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import ReduceLROnPlateau

from stratagem.accelerators import Accelerator
from stratagem.checkpoint_io import CheckpointIO, PathLike
from stratagem.environments import ClusterEnvironment
from stratagem.precision import Precision
from stratagem.strategies import LoopSettings, SingleDeviceStrategy, StepsLRSchedulers, TakesLoopSettings
from stratagem_hivemind.options import INITIAL_PEERS_VARIABLE, SwarmOptions, swarm_options
from stratagem_hivemind.swarm import Swarm

logger = logging.getLogger(__name__)

SWARM_STATE_KEY = "hivemind"
"""The checkpoint entry holding the collaborative epoch; other strategies ignore it."""


class HivemindStrategy(SingleDeviceStrategy, TakesLoopSettings, StepsLRSchedulers):
    """One peer of a hivemind swarm training on one device; see the module's docstring and the package README."""

    max_optimizers: ClassVar[int | None] = 1
    max_lr_schedulers: ClassVar[int | None] = 1

    def __init__(
        self,
        target_batch_size: int | None = None,
        batch_size_per_step: int | None = None,
        run_id: str = "stratagem",
        initial_peers: str | Sequence[str] | None = None,
        host_maddrs: str | Sequence[str] = ("/ip4/0.0.0.0/tcp/0",),
        min_peers: int | None = None,
        join_timeout: float = 300.0,
        use_local_updates: bool = False,
        matchmaking_time: float = 5.0,
        averaging_timeout: float = 30.0,
        delay_state_averaging: bool = False,
        delay_optimizer_step: bool = False,
        delay_grad_averaging: bool = False,
        verbose: bool = False,
        device: torch.device | str | int | None = None,
        accelerator: Accelerator | None = None,
        precision: Precision | None = None,
        checkpoint_io: CheckpointIO | None = None,
    ) -> None:
        self.options: SwarmOptions = swarm_options(
            target_batch_size=target_batch_size,
            batch_size_per_step=batch_size_per_step,
            run_id=run_id,
            initial_peers=initial_peers,
            host_maddrs=host_maddrs,
            min_peers=min_peers,
            join_timeout=join_timeout,
            use_local_updates=use_local_updates,
            matchmaking_time=matchmaking_time,
            averaging_timeout=averaging_timeout,
            delay_state_averaging=delay_state_averaging,
            delay_optimizer_step=delay_optimizer_step,
            delay_grad_averaging=delay_grad_averaging,
            verbose=verbose,
        )
        super().__init__(device=device, accelerator=accelerator, precision=precision, checkpoint_io=checkpoint_io)
        self.swarm: Swarm | None = None
        self._optimizer: Optimizer | None = None

    def configure_placement(
        self, *, devices: list[torch.device], num_nodes: int, cluster_environment: ClusterEnvironment
    ) -> None:
        asked = len(devices) * num_nodes
        if asked != 1:
            raise ValueError(
                f"strategy='hivemind' runs one peer per process on one device, but devices={len(devices)} and "
                f"num_nodes={num_nodes} ask for {asked}. Start each peer as a process of its own with devices=1; "
                f"the others join the first with initial_peers (or {INITIAL_PEERS_VARIABLE}) set to the address "
                "it prints."
            )
        super().configure_placement(devices=devices, num_nodes=num_nodes, cluster_environment=cluster_environment)

    def complete_configuration(self) -> None:
        super().complete_configuration()
        if getattr(self.precision, "scaler", None) is not None:
            raise ValueError(
                f"precision={self.precision.name!r} scales gradients with torch's GradScaler, whose step hivemind's "
                "optimizer does not take; use '32-true' or 'bf16-mixed' with strategy 'hivemind'."
            )

    @property
    def batch_size_per_step(self) -> int | None:
        """Samples behind one local optimizer step: the option, else the training loader's batch size times
        ``accumulate_grad_batches`` (``None`` until ``fit`` knows the loader's batch size)."""
        if self.options.batch_size_per_step is not None:
            return self.options.batch_size_per_step
        settings = self.loop_settings
        if settings.train_batch_size is None:
            return None
        return settings.train_batch_size * settings.accumulate_grad_batches

    def connect_loop_settings(self, settings: LoopSettings) -> None:
        super().connect_loop_settings(settings)
        target, per_step = self.options.target_batch_size, self.batch_size_per_step
        if target is not None and per_step is not None and per_step > target:
            raise ValueError(
                f"HivemindStrategy(target_batch_size={target}) is smaller than one local step's {per_step} samples "
                "(batch size x accumulate_grad_batches): every step would end a collaborative epoch before any peer "
                "could join it. Raise target_batch_size."
            )

    def setup_optimizers(self, optimizers: list[Optimizer]) -> list[Optimizer]:
        optimizers = super().setup_optimizers(optimizers)
        if not optimizers:
            raise ValueError("HivemindStrategy needs the optimizer configure_optimizers returns; it returned none.")
        self._optimizer = optimizers[0]
        return optimizers

    def check_lr_schedulers(self, schedulers: list[Any]) -> None:
        super().check_lr_schedulers(schedulers)
        scheduler = schedulers[0] if schedulers else None
        if isinstance(scheduler, ReduceLROnPlateau):
            raise ValueError(
                "HivemindStrategy steps the learning-rate scheduler once per collaborative epoch, without a metric; "
                "ReduceLROnPlateau needs one. Use a scheduler that steps on its own (StepLR, OneCycleLR, ...)."
            )
        if scheduler is not None and self.options.delays_updates:
            raise ValueError(
                "HivemindStrategy(delay_optimizer_step=True) steps an optimizer hivemind builds on its own copy of the "
                "parameters, which the scheduler configure_optimizers returned cannot follow; train without one, "
                "or without delayed updates."
            )
        # Called by fit right after setup_optimizers, with everything the swarm's optimizer needs.
        self._join_swarm(scheduler)

    def _join_swarm(self, scheduler: Any | None) -> None:
        if self._optimizer is None:
            raise RuntimeError("HivemindStrategy joins the swarm after setup_optimizers(), which has not run.")
        batch_size = self.batch_size_per_step
        if batch_size is None:
            raise ValueError(
                "HivemindStrategy cannot tell how many samples one step holds: the training data has no batch_size "
                "(an iterable of ready-made batches?). Pass HivemindStrategy(batch_size_per_step=...)."
            )
        self.swarm = Swarm(self.options, self._optimizer, scheduler, batch_size)
        logger.warning("%s", self.swarm.join_hint())
        self.swarm.wait_for_peers(self.options.min_peers, self.options.join_timeout)
        if self.options.initial_peers:
            self.swarm.download_state()

    def optimizer_step(self, optimizer: Optimizer) -> Any:
        if self.swarm is None:
            raise RuntimeError("HivemindStrategy.optimizer_step() before the peer joined its swarm (in fit).")
        return self.precision.optimizer_step(optimizer, self.swarm.step)

    def save_checkpoint(self, path: PathLike, state: dict[str, Any]) -> None:
        if self.swarm is not None:
            self.swarm.settle()
            state = {**state, SWARM_STATE_KEY: {"epoch": self.swarm.epoch, "run_id": self.options.run_id}}
            if "optimizers" in state:
                state["optimizers"] = [self.swarm.torch_optimizer]
        super().save_checkpoint(path, state)

    def load_checkpoint(
        self, path: PathLike, state: dict[str, Any], strict: bool = True, weights_only: bool = True
    ) -> dict[str, Any]:
        if self.swarm is not None and "optimizers" in state:
            state = {**state, "optimizers": [self.swarm.torch_optimizer]}
        remaining = super().load_checkpoint(path, state, strict=strict, weights_only=weights_only)
        saved = remaining.pop(SWARM_STATE_KEY, None)
        if self.swarm is not None:
            self.swarm.adopt_parameters()
            if isinstance(saved, dict) and isinstance(saved.get("epoch"), int):
                self.swarm.set_epoch(saved["epoch"])
        return remaining

    def teardown(self) -> None:
        swarm, self.swarm, self._optimizer = self.swarm, None, None
        try:
            if swarm is not None:
                swarm.shutdown()
        finally:
            super().teardown()

    def __repr__(self) -> str:
        peers = ", ".join(self.options.initial_peers) or "none: starts a swarm"
        return f"HivemindStrategy(run_id={self.options.run_id!r}, initial_peers={peers})"
