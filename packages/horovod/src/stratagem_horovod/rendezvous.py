"""Horovod's Gloo rendezvous for ranks stratagem started: what ``horovodrun --gloo`` does before it starts them.

horovod's ranks find each other through an HTTP rendezvous server that knows every rank's slot (host,
rank, local rank, cross rank). Rank 0 runs that server in a thread; every rank learns its address and
its slot, and ``hvd.init()`` reads them from the ``HOROVOD_*`` variables set here.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Slot:
    """One rank's place in horovod's world, as horovod's rendezvous server hands it out."""

    hostname: str
    rank: int
    local_rank: int
    cross_rank: int
    size: int
    local_size: int
    cross_size: int


def start_rendezvous_server(hostnames: list[str]) -> tuple[Any, int, list[Slot]]:
    """Start horovod's rendezvous server for ranks on ``hostnames`` (one entry per rank, in rank order).

    Returns the server (stop it with ``.stop()``), the port it listens on, and every rank's slot.
    """
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.http.http_server import RendezvousServer

    per_host = Counter(hostnames)
    hosts = ",".join(f"{host}:{count}" for host, count in per_host.items())
    plan = get_host_assignments(parse_hosts(hosts), len(hostnames))
    server = RendezvousServer(verbose=0)
    port = server.start()
    server.init(plan)
    slots = [Slot(**{field: getattr(slot, field) for field in Slot.__dataclass_fields__}) for slot in plan]
    return server, port, slots


def horovod_variables(slot: Slot, address: str, port: int, iface: str) -> dict[str, str]:
    """The ``HOROVOD_*`` variables ``hvd.init()`` reads to join the rendezvous as ``slot``."""
    variables = {f"HOROVOD_{name.upper()}": str(value) for name, value in asdict(slot).items()}
    return {
        **variables,
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": address,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_IFACE": iface,
    }


def set_variables(variables: dict[str, str]) -> dict[str, str | None]:
    """Set ``variables`` in this process's environment; return what they replaced, for :func:`restore_variables`."""
    previous = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    return previous


def restore_variables(previous: dict[str, str | None]) -> None:
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
