"""What a launcher tells each rank it starts, and the rendezvous checks done before starting."""

from __future__ import annotations

import errno
import socket

from stratagem.environments.cluster_environment import ClusterEnvironment


def rank_environment(
    cluster_environment: ClusterEnvironment, local_rank: int, num_processes: int, num_nodes: int
) -> dict[str, str]:
    """The variables that place a process started by a launcher at ``local_rank`` on this node.

    Reading ``main_port`` here fixes the port (a free one is chosen when ``MASTER_PORT`` is
    unset), so every rank agrees on it.
    """
    return {
        "MASTER_ADDR": cluster_environment.main_address,
        "MASTER_PORT": str(cluster_environment.main_port),
        "NODE_RANK": str(cluster_environment.node_rank()),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(num_processes * num_nodes),
    }


def check_placement(cluster_environment: ClusterEnvironment, num_devices: int, num_nodes: int) -> None:
    """Raise ``ValueError`` when the environment places this process outside the job of ``num_devices`` x
    ``num_nodes`` processes, where it would wait forever for peers that do not exist.

    The built-in environments name the offending variable themselves in ``validate_settings``;
    this catches what any environment, a plugin's included, reports.
    """
    world_size = cluster_environment.world_size()
    if world_size != num_devices * num_nodes:
        raise ValueError(
            f"{cluster_environment!r} reports a world size of {world_size}, but devices={num_devices} x "
            f"num_nodes={num_nodes} = {num_devices * num_nodes}. Set devices and num_nodes to the job's."
        )
    for what, rank, limit, limit_text in (
        ("global rank", cluster_environment.global_rank(), world_size, f"a world size of {world_size}"),
        ("local rank", cluster_environment.local_rank(), num_devices, f"devices={num_devices}"),
        ("node rank", cluster_environment.node_rank(), num_nodes, f"num_nodes={num_nodes}"),
    ):
        if not 0 <= rank < limit:
            raise ValueError(
                f"{cluster_environment!r} places this process at {what} {rank}, outside {limit_text} (expected 0 "
                f"to {limit - 1}); check the variables it reads."
            )


def check_main_port_free(cluster_environment: ClusterEnvironment) -> None:
    """Raise ``ValueError`` when node 0 would host the rendezvous on a port something already uses.

    Without this, rank 0 fails deep inside ``init_process_group`` after the other ranks
    have started and are waiting for it.
    """
    if cluster_environment.node_rank() != 0:
        return
    port = cluster_environment.main_port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # Same options as torch's TCPStore: a port held only by closed connections is usable.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                raise
            raise ValueError(port_in_use_message(port)) from None


def port_in_use_message(port: int) -> str:
    return (
        f"MASTER_PORT={port} is already in use on this machine (by another run or another program), so rank 0 "
        "cannot host the process-group rendezvous there. Set MASTER_PORT to a free port, or unset it and "
        "stratagem chooses a free one."
    )
