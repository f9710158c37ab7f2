from __future__ import annotations

import os
import socket
from pathlib import Path

from stratagem.environments._variables import (
    check_main_address,
    check_rank,
    int_variable,
    port_variable,
    rank_variable,
    size_variable,
    str_variable,
)
from stratagem.environments.cluster_environment import ClusterEnvironment

_HINT = "jsrun sets it for every rank it starts."
_PORT_BASE = 10000
_PORT_SPAN = 5000


class LSFEnvironment(ClusterEnvironment):
    """Ranks started by ``jsrun`` in an IBM Spectrum LSF job, one per device.

    Ranks come from the job step manager: ``JSM_NAMESPACE_RANK``, ``JSM_NAMESPACE_LOCAL_RANK``
    and ``JSM_NAMESPACE_SIZE``. The job's hosts are read from the file named by
    ``LSB_DJOB_RANKFILE`` (one host per slot) or, without it, from ``LSB_MCPU_HOSTS``
    (``"host slots host slots ..."``). In both, the first host is the launch node, which runs
    no ranks, and is left out; the rendezvous host is the first compute host and a node's
    rank is its position among the compute hosts. The port is ``MASTER_PORT`` if set, else
    derived from ``LSB_JOBID``.
    """

    detected_by = ("LSB_JOBID", "JSM_NAMESPACE_RANK", "JSM_NAMESPACE_LOCAL_RANK", "JSM_NAMESPACE_SIZE")

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        if os.environ.get("MASTER_ADDR"):
            return os.environ["MASTER_ADDR"]
        return self.compute_hosts()[0]

    @property
    def main_port(self) -> int:
        if "MASTER_PORT" in os.environ:
            return port_variable("MASTER_PORT")
        return _PORT_BASE + int_variable("LSB_JOBID", minimum=0, hint="LSF sets it in every job.") % _PORT_SPAN

    @staticmethod
    def detect() -> bool:
        return all(name in os.environ for name in LSFEnvironment.detected_by)

    def world_size(self) -> int:
        return size_variable("JSM_NAMESPACE_SIZE", hint=_HINT)

    def global_rank(self) -> int:
        return rank_variable("JSM_NAMESPACE_RANK", "JSM_NAMESPACE_SIZE", hint=_HINT)

    def local_rank(self) -> int:
        return rank_variable("JSM_NAMESPACE_LOCAL_RANK", hint=_HINT)

    def node_rank(self) -> int:
        hosts = self.compute_hosts()
        hostname = socket.gethostname()
        if hostname in hosts:
            return hosts.index(hostname)
        # The rank file and the host may disagree on the domain part (short name vs FQDN).
        short_names = [host.split(".")[0] for host in hosts]
        if hostname.split(".")[0] in short_names:
            return short_names.index(hostname.split(".")[0])
        raise ValueError(f"This host ({hostname}) is not among the LSF job's compute hosts {hosts}.")

    def compute_hosts(self) -> list[str]:
        """The job's compute hosts, each once, in the order LSF lists them (launch node left out)."""
        hosts = _hosts_from_rankfile() if os.environ.get("LSB_DJOB_RANKFILE") else _hosts_from_mcpu_hosts()
        unique = list(dict.fromkeys(hosts[1:]))
        if not unique:
            raise ValueError(f"The LSF job lists no compute host besides the launch node ({hosts}).")
        return unique

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        hosts = self.compute_hosts()
        if len(hosts) != num_nodes:
            raise ValueError(
                f"The LSF job has {len(hosts)} compute host(s) ({', '.join(hosts)}), but num_nodes={num_nodes}. "
                f"Set num_nodes={len(hosts)}."
            )
        world_size = self.world_size()
        if world_size != num_devices * num_nodes:
            raise ValueError(
                f"jsrun started JSM_NAMESPACE_SIZE={world_size} ranks, but devices={num_devices} x num_nodes="
                f"{num_nodes} = {num_devices * num_nodes}. Start one rank per device (jsrun --rs_per_host) or "
                f"set devices={world_size // num_nodes}."
            )
        # Each variable is checked where it is read: read them all before anything starts.
        self.global_rank()
        check_rank("JSM_NAMESPACE_LOCAL_RANK", self.local_rank(), num_devices, f"devices={num_devices}", hint=_HINT)
        _ = self.main_port
        check_main_address(
            self.main_address, derived_from="the job's first compute host", must_resolve_now=self.node_rank() == 0
        )

    def __repr__(self) -> str:
        return f"LSFEnvironment(job_id={os.environ.get('LSB_JOBID')!r})"


def _hosts_from_rankfile() -> list[str]:
    path = Path(os.environ["LSB_DJOB_RANKFILE"])
    try:
        lines = path.read_text().splitlines()
    except OSError as error:
        raise ValueError(f"Cannot read LSB_DJOB_RANKFILE={str(path)!r}: {error}") from None
    return [line.strip() for line in lines if line.strip()]


def _hosts_from_mcpu_hosts() -> list[str]:
    value = str_variable(
        "LSB_MCPU_HOSTS", hint="LSF sets it (or LSB_DJOB_RANKFILE) in every job; they list the job's hosts."
    )
    fields = value.split()
    if len(fields) % 2:
        raise ValueError(f"LSB_MCPU_HOSTS={value!r} is not of the form 'host slots host slots ...'.")
    return fields[0::2]
