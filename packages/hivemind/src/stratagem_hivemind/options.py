"""The swarm's options: checked when the strategy is created, with what the environment supplies.

Nothing here imports hivemind, so that a bad option fails at once, before the seconds hivemind's
import and its DHT daemon take.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

INITIAL_PEERS_VARIABLE = "STRATAGEM_HIVEMIND_INITIAL_PEERS"
"""Addresses of peers already in the swarm (multiaddrs, separated by commas or spaces), when the
strategy is given none: how a second ``stratagem demo --strategy hivemind`` finds the first."""

MIN_PEERS_VARIABLE = "STRATAGEM_HIVEMIND_MIN_PEERS"
"""How many peers the swarm must hold before this one trains, when the strategy is given no ``min_peers``."""

DEFAULT_HOST_MADDRS = ("/ip4/0.0.0.0/tcp/0",)
"""Listen on every interface, on a free TCP port: peers on other machines can reach this one."""


@dataclass(frozen=True)
class SwarmOptions:
    """How this peer joins the swarm and trains with it (see the package README for each option)."""

    target_batch_size: int | None = None
    batch_size_per_step: int | None = None
    run_id: str = "stratagem"
    initial_peers: tuple[str, ...] = ()
    host_maddrs: tuple[str, ...] = DEFAULT_HOST_MADDRS
    min_peers: int = 1
    join_timeout: float = 300.0
    use_local_updates: bool = False
    matchmaking_time: float = 5.0
    averaging_timeout: float = 30.0
    delay_state_averaging: bool = False
    delay_optimizer_step: bool = False
    delay_grad_averaging: bool = False
    verbose: bool = False

    @property
    def delays_updates(self) -> bool:
        """Whether hivemind runs the optimizer in the background, on its own copy of the parameters."""
        return self.delay_optimizer_step or self.delay_grad_averaging

    def target_for(self, batch_size_per_step: int) -> int:
        """The swarm's samples per collaborative epoch: as given, else every expected peer's step once."""
        if self.target_batch_size is not None:
            return self.target_batch_size
        return batch_size_per_step * self.min_peers


def swarm_options(
    *,
    target_batch_size: int | None,
    batch_size_per_step: int | None,
    run_id: str,
    initial_peers: str | Sequence[str] | None,
    host_maddrs: str | Sequence[str],
    min_peers: int | None,
    join_timeout: float,
    use_local_updates: bool,
    matchmaking_time: float,
    averaging_timeout: float,
    delay_state_averaging: bool,
    delay_optimizer_step: bool,
    delay_grad_averaging: bool,
    verbose: bool,
    environ: Mapping[str, str] = os.environ,
) -> SwarmOptions:
    """Check every option (a ``ValueError``/``TypeError`` names the option, the value and what is accepted)
    and fill ``initial_peers`` and ``min_peers`` from the environment where they are not given."""
    for name, count in (("target_batch_size", target_batch_size), ("batch_size_per_step", batch_size_per_step)):
        if count is not None:
            _positive_int(name, count)
    if not isinstance(run_id, str) or not run_id or any(character.isspace() for character in run_id):
        raise ValueError(
            f"HivemindStrategy(run_id={run_id!r}) is not valid; expected a non-empty string without spaces, the same "
            "on every peer of the run."
        )
    for name, seconds in (
        ("join_timeout", join_timeout),
        ("matchmaking_time", matchmaking_time),
        ("averaging_timeout", averaging_timeout),
    ):
        _positive_seconds(name, seconds)
    flags = {
        "use_local_updates": use_local_updates,
        "delay_state_averaging": delay_state_averaging,
        "delay_optimizer_step": delay_optimizer_step,
        "delay_grad_averaging": delay_grad_averaging,
        "verbose": verbose,
    }
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"HivemindStrategy({name}={value!r}) is not valid; expected True or False.")
    if delay_grad_averaging and not delay_optimizer_step:
        raise ValueError(
            "HivemindStrategy(delay_grad_averaging=True) needs delay_optimizer_step=True: hivemind averages gradients "
            "in the background only for an optimizer step that also runs there."
        )
    if delay_optimizer_step and not delay_state_averaging:
        raise ValueError(
            "HivemindStrategy(delay_optimizer_step=True) needs delay_state_averaging=True: hivemind averages the "
            "parameters in the background when the optimizer steps there."
        )
    if use_local_updates and delay_grad_averaging:
        raise ValueError(
            "HivemindStrategy(use_local_updates=True) averages parameters, not gradients: delay_grad_averaging=True "
            "has nothing to delay. Use one or the other."
        )
    peers = _addresses("initial_peers", initial_peers if initial_peers is not None else _from(environ))
    if min_peers is None:
        min_peers = _min_peers_from(environ)
    _positive_int("min_peers", min_peers)
    return SwarmOptions(
        target_batch_size=target_batch_size,
        batch_size_per_step=batch_size_per_step,
        run_id=run_id,
        initial_peers=peers,
        host_maddrs=_addresses("host_maddrs", host_maddrs) or DEFAULT_HOST_MADDRS,
        min_peers=min_peers,
        join_timeout=float(join_timeout),
        use_local_updates=use_local_updates,
        matchmaking_time=float(matchmaking_time),
        averaging_timeout=float(averaging_timeout),
        delay_state_averaging=delay_state_averaging,
        delay_optimizer_step=delay_optimizer_step,
        delay_grad_averaging=delay_grad_averaging,
        verbose=verbose,
    )


def _from(environ: Mapping[str, str]) -> str:
    return environ.get(INITIAL_PEERS_VARIABLE, "")


def _min_peers_from(environ: Mapping[str, str]) -> int:
    text = environ.get(MIN_PEERS_VARIABLE, "").strip()
    if not text:
        return 1
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{MIN_PEERS_VARIABLE}={text!r} is not valid; expected a positive int (peers to wait for).")
    return value


def _addresses(option: str, value: str | Sequence[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        items = value.replace(",", " ").split()
    elif isinstance(value, Sequence) and all(isinstance(item, str) for item in value):
        items = [item.strip() for item in value if item.strip()]
    else:
        raise TypeError(
            f"HivemindStrategy({option}={value!r}) is not valid; expected a multiaddr string or a list of them."
        )
    for item in items:
        if not item.startswith("/"):
            raise ValueError(
                f"HivemindStrategy({option}={value!r}) is not valid: {item!r} is not a multiaddr; expected addresses "
                "such as '/ip4/192.0.2.1/tcp/31337/p2p/QmPeerId' (the ones a running peer prints)."
            )
    return tuple(items)


def _positive_int(option: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"HivemindStrategy({option}={value!r}) is not valid; expected a positive int.")


def _positive_seconds(option: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"HivemindStrategy({option}={value!r}) is not valid; expected a positive number of seconds.")
