"""Test hosts: network namespaces joined by a veth pair, each with its own address, hostname, /etc/hosts and,
where a test asks, its own directory mounted over a shared path (a filesystem the hosts do not share).

Traffic flows only between the hosts: the veth pair lives inside them, not in the machine's namespace.
Creating them needs root (or CAP_SYS_ADMIN and CAP_NET_ADMIN); :func:`why_unavailable` says why not.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import torch

SUBNET = "10.97.0"
JOB = Path(__file__).with_name("job.py")


@dataclass
class Host:
    name: str  # the hostname inside, and the namespace's name
    address: str
    hosts_file: Path
    namespace: str
    interface: str = ""  # its end of the link to the other hosts
    mounts: dict[str, str] = field(default_factory=dict)  # mounted over (path inside) -> from (path outside)

    def command(self, argv: list[str], mounts: dict[str, str] | None = None) -> list[str]:
        """``argv`` run on this host: in its network namespace, with its own hostname and /etc/hosts."""
        binds = [("/etc/hosts", str(self.hosts_file)), *{**self.mounts, **(mounts or {})}.items()]
        setup = [f"hostname {shlex.quote(self.name)}"]
        for inside, outside in binds:
            setup.append(f"mkdir -p {shlex.quote(inside)} 2>/dev/null || true")
            setup.append(f"mount --bind {shlex.quote(outside)} {shlex.quote(inside)}")
        script = " && ".join(setup) + ' && exec "$@"'
        # nsenter, not `ip netns exec`: that remounts /sys, losing the cgroup mounts slurmd needs.
        return [
            "nsenter", f"--net=/run/netns/{self.namespace}",
            "unshare", "--uts", "--mount", "--propagation", "private",
            "sh", "-c", script, "sh", *argv,
        ]  # fmt: skip

    def start(self, argv: list[str], log: Path, env: dict[str, str] | None = None, **options) -> subprocess.Popen:
        """Start ``argv`` on this host in its own process group, its output into ``log``."""
        with log.open("wb") as output:
            return subprocess.Popen(
                self.command(argv, options.pop("mounts", None)),
                stdout=output,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                start_new_session=True,
                **options,
            )


def why_unavailable() -> str | None:
    """Why test hosts cannot be created here, or ``None`` when they can."""
    if sys.platform != "linux":
        return f"network namespaces need Linux (this is {sys.platform})"
    for tool in ("ip", "nsenter", "unshare", "mount", "hostname"):
        if shutil.which(tool) is None:
            return f"the {tool!r} command is missing (iproute2 / util-linux)"
    probe = f"smhp{uuid.uuid4().hex[:8]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace (`ip netns add` says: {made.stderr.strip()}); it needs root"
    try:
        inside = subprocess.run(
            ["nsenter", f"--net=/run/netns/{probe}", "unshare", "--uts", "--mount", "true"],
            capture_output=True,
            text=True,
        )
        if inside.returncode != 0:
            return f"cannot create UTS and mount namespaces (unshare says: {inside.stderr.strip()})"
    finally:
        subprocess.run(["ip", "netns", "delete", probe], capture_output=True)
    return None


def create_hosts(directory: Path, count: int = 2, loopback_name: set[str] = frozenset()) -> list[Host]:
    """``count`` hosts on one link (a bridge-free veth pair for two, a bridge namespace for more).

    A host named in ``loopback_name`` gets an /etc/hosts that maps its own name to 127.0.1.1, as Debian's does.
    """
    if count != 2:
        raise ValueError(f"count={count}: two hosts are supported (one veth pair)")
    tag = uuid.uuid4().hex[:6]
    names = [f"mh{tag}{letter}" for letter in "ab"[:count]]
    addresses = [f"{SUBNET}.{index + 1}" for index in range(count)]
    hosts = []
    for name, address in zip(names, addresses):
        lines = ["127.0.0.1 localhost"]
        for other, other_address in zip(names, addresses):
            lines.append(f"{'127.0.1.1' if other == name and name in loopback_name else other_address} {other}")
        hosts_file = directory / f"{name}.hosts"
        hosts_file.write_text("\n".join(lines) + "\n")
        hosts.append(Host(name=name, address=address, hosts_file=hosts_file, namespace=name))
    try:
        for host in hosts:
            _run("ip", "netns", "add", host.namespace)
            _run("ip", "-n", host.namespace, "link", "set", "lo", "up")
        first, second = hosts
        _run("ip", "link", "add", f"v{tag}a", "type", "veth", "peer", "name", f"v{tag}b")
        for host, interface in ((first, f"v{tag}a"), (second, f"v{tag}b")):
            host.interface = interface
            _run("ip", "link", "set", interface, "netns", host.namespace)
            _run("ip", "-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", interface)
            _run("ip", "-n", host.namespace, "link", "set", interface, "up")
    except BaseException:
        delete_hosts(hosts)
        raise
    return hosts


def set_link(host: Host, state: str) -> None:
    """Take ``host`` off the link to the other hosts (``"down"``: it vanishes, no packet answers) or back on."""
    _run("ip", "-n", host.namespace, "link", "set", host.interface, state)


def delete_hosts(hosts: list[Host]) -> None:
    for host in hosts:
        subprocess.run(["ip", "netns", "delete", host.namespace], capture_output=True)


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def assert_close(weights: dict, reference: dict) -> None:
    """Weights equal to the reference's up to float rounding (the sums of a split batch run in another order)."""
    assert weights.keys() == reference.keys()
    for name in reference:
        torch.testing.assert_close(weights[name], reference[name], rtol=0, atol=1e-6)
