"""This peer's part of the swarm: its DHT node and the hivemind optimizer on it, started and shut down together."""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from torch.optim import Optimizer

from stratagem_hivemind.options import INITIAL_PEERS_VARIABLE, SwarmOptions

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.5
ANNOUNCEMENT_SECONDS = 60.0
"""How long a waiting peer's announcement stays in the DHT (renewed while it waits); peers that train are
counted by hivemind's progress tracker instead."""
REQUEST_TIMEOUT = 3.0
"""hivemind's default for one matchmaking request, in seconds."""


class Swarm:
    """A started DHT node and a ``hivemind.Optimizer`` stepping ``optimizer`` with the peers of ``options.run_id``.

    Without delayed updates hivemind steps the user's optimizer itself (its learning-rate scheduler with it);
    with them it builds its own optimizer of the same type on a copy of the parameters
    (:attr:`torch_optimizer`), which a checkpoint saves in the user's optimizer's place.
    """

    def __init__(
        self, options: SwarmOptions, optimizer: Optimizer, scheduler: Any | None, batch_size_per_step: int
    ) -> None:
        import hivemind

        if not options.verbose:
            # hivemind logs every matchmaking attempt at INFO; verbose=True keeps them.
            logging.getLogger("hivemind").setLevel(logging.WARNING)
        self.options = options
        self.batch_size_per_step = batch_size_per_step
        self._parameters = [parameter for group in optimizer.param_groups for parameter in group["params"]]
        self.dht = hivemind.DHT(
            start=True, initial_peers=list(options.initial_peers), host_maddrs=list(options.host_maddrs)
        )
        try:
            if options.delays_updates:
                built: dict[str, Any] = {
                    "params": optimizer.param_groups,
                    "optimizer": _same_optimizer_on(optimizer),
                    "offload_optimizer": True,
                    "delay_optimizer_step": options.delay_optimizer_step,
                    "delay_grad_averaging": options.delay_grad_averaging,
                }
            else:
                built = {"optimizer": optimizer, "scheduler": scheduler, "offload_optimizer": False}
            self.optimizer = hivemind.Optimizer(
                dht=self.dht,
                run_id=options.run_id,
                target_batch_size=options.target_for(batch_size_per_step),
                batch_size_per_step=batch_size_per_step,
                matchmaking_time=options.matchmaking_time,
                averaging_timeout=options.averaging_timeout,
                use_local_updates=options.use_local_updates,
                delay_state_averaging=options.delay_state_averaging,
                verbose=options.verbose,
                # hivemind warns that a request timeout above the matchmaking time can deadlock matchmaking.
                averager_opts={"request_timeout": min(REQUEST_TIMEOUT, options.matchmaking_time / 2)},
                **built,
            )
        except BaseException:
            self.dht.shutdown()
            raise

    @property
    def addresses(self) -> list[str]:
        """The multiaddrs other peers can join this one at."""
        return [str(address) for address in self.dht.get_visible_maddrs()]

    def join_hint(self) -> str:
        """One line saying where this peer is and how another one joins it."""
        return (
            f"hivemind: peer of run {self.options.run_id!r}, epoch {self.epoch}; other peers join with "
            f"{INITIAL_PEERS_VARIABLE}={','.join(self.addresses)}"
        )

    @property
    def torch_optimizer(self) -> Optimizer:
        """The torch optimizer hivemind steps (the user's, unless updates are delayed)."""
        optimizer: Optimizer = self.optimizer.opt
        return optimizer

    @property
    def epoch(self) -> int:
        """The collaborative epoch this peer is at: how many times the swarm reached ``target_batch_size``."""
        return int(self.optimizer.local_epoch)

    @property
    def peers(self) -> int:
        """How many peers of this run the swarm holds, as this peer last learned it (itself included)."""
        return int(self.optimizer.tracker.global_progress.num_peers)

    def wait_for_peers(self, min_peers: int, timeout: float) -> None:
        """Return once ``min_peers`` peers (this one included) wait here or train; ``TimeoutError`` after ``timeout``.

        hivemind's own count of peers includes only peers that have accumulated samples: peers that wait for each
        other before their first step would never see each other there. Every joining peer therefore announces
        itself in the DHT under a key of this run (renewed while it waits), and a waiting peer counts those
        announcements as well as the peers that train.
        """
        deadline = time.monotonic() + timeout
        if min_peers > 1:
            logger.warning("hivemind: waiting until run %r has %d peers", self.options.run_id, min_peers)
        while True:
            present = max(self._announce(), self.peers)
            if present >= min_peers:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"hivemind: run {self.options.run_id!r} had {present} of min_peers={min_peers} peers after "
                    f"join_timeout={timeout:g} s. Start the others with {INITIAL_PEERS_VARIABLE}="
                    f"{','.join(self.addresses)}, or lower min_peers."
                )
            time.sleep(POLL_SECONDS)

    def _announce(self) -> int:
        """Say in the DHT that this peer is here; return how many peers said so."""
        from hivemind.utils import get_dht_time

        key = f"{self.options.run_id}_stratagem_peers"
        self.dht.store(key, True, get_dht_time() + ANNOUNCEMENT_SECONDS, subkey=self.dht.peer_id.to_base58())
        found = self.dht.get(key, latest=True)
        return len(found.value) if found is not None and isinstance(found.value, dict) else 0

    def download_state(self) -> None:
        """Replace this peer's parameters, optimizer state, scheduler and epoch with the swarm's newest."""
        self.optimizer.load_state_from_peers()

    def step(self) -> Any:
        """One local optimizer step: accumulate this step's gradients, and step with the swarm at an epoch's end."""
        return self.optimizer.step(batch_size=self.batch_size_per_step)

    def settle(self) -> None:
        """Finish and apply an optimizer step running in the background (delayed updates), so that the
        parameters and optimizer state are the ones it leads to."""
        if self.options.delays_updates:
            self.optimizer.state_averager.step(wait_for_delayed_updates=True)

    def set_epoch(self, epoch: int) -> None:
        """Continue from a checkpoint's collaborative epoch."""
        state = self.torch_optimizer.state_dict()
        self.optimizer.load_state_dict({**state, "state": {**state["state"], "local_epoch": epoch}})
        # The tracker learns the epoch as hivemind's own step tells it, so that it counts this epoch's samples
        # at once instead of waiting for a report from peers (a lone resumed peer would wait for ever).
        tracker = self.optimizer.tracker
        with tracker.pause_updates():
            tracker.update_epoch(epoch)

    def adopt_parameters(self) -> None:
        """After the user's parameters were loaded from a checkpoint: give hivemind's copy the same values."""
        if not self.options.delays_updates:
            return
        with torch.no_grad():
            for main, parameter in zip(self.optimizer.state_averager.main_parameters, self._parameters, strict=True):
                main.copy_(parameter)

    def shutdown(self) -> None:
        """Say goodbye to the peers, stop the averagers and the DHT daemon."""
        try:
            self.optimizer.shutdown()
            # A round trip through the DHT: it has taken in the goodbye the optimizer's tracker sent without
            # waiting, so that stopping it now neither loses that message nor waits out its grace period.
            self.dht.get_visible_maddrs()
        finally:
            self.dht.shutdown()


def _same_optimizer_on(optimizer: Optimizer) -> Any:
    """A factory building ``optimizer``'s type with its hyperparameters on the parameter groups it is given."""
    optimizer_type, defaults = type(optimizer), dict(optimizer.defaults)

    def build(param_groups: Any) -> Optimizer:
        return optimizer_type(param_groups, **defaults)

    return build
