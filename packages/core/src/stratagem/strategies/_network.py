"""Which network interface gloo listens on, when the host's own name would send it to loopback.

Gloo listens on the address this host's name resolves to, and on loopback when the name does not
resolve. Many machines map their name to loopback (Debian's ``127.0.1.1`` line in ``/etc/hosts``).
Across machines the other nodes then dial their own loopback: one fails at once, the others hang until
the collective timeout. The interface that routes to ``MASTER_ADDR`` is one every node can reach.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct
import sys

GLOO_INTERFACE_VARIABLE = "GLOO_SOCKET_IFNAME"
_SIOCGIFADDR = 0x8915


def choose_gloo_interface(main_address: str, announce: bool) -> None:
    """Set ``GLOO_SOCKET_IFNAME`` to the interface that routes to ``main_address`` when this host's name
    leads gloo to loopback but ``main_address`` is another machine; raise ``RuntimeError`` naming the
    variable when no interface can be found. Leaves a ``GLOO_SOCKET_IFNAME`` the user set alone.

    ``announce``: say so on stderr (once per node, not once per rank).
    """
    if os.environ.get(GLOO_INTERFACE_VARIABLE):
        return
    target = _resolve(main_address)
    if target is None or target.is_loopback:
        return
    host = socket.gethostname()
    own = _resolve_all(host)
    if own and not all(address.is_loopback for address in own):
        return
    reason = (
        f"this host's name {host!r} resolves to {', '.join(map(str, sorted(own, key=str)))} (loopback)"
        if own
        else f"this host's name {host!r} does not resolve"
    )
    local = _source_address(target)
    interface = _interface_with(local) if local is not None else None
    if interface is None:
        raise RuntimeError(
            f"{reason}, so gloo would listen on loopback, where the other nodes cannot reach it; and no interface "
            f"of this host routes to MASTER_ADDR={main_address} ({target}). Set {GLOO_INTERFACE_VARIABLE} (and "
            "NCCL_SOCKET_IFNAME for nccl) to the network interface the nodes reach each other by (see `ip addr`), "
            "or map this host's name to that interface's address in /etc/hosts."
        )
    os.environ[GLOO_INTERFACE_VARIABLE] = interface
    if announce:
        print(
            f"stratagem: {reason}, where the other nodes cannot reach gloo; it listens on {interface} ({local}), "
            f"the interface that routes to MASTER_ADDR={main_address}. Set {GLOO_INTERFACE_VARIABLE} to choose "
            "another.",
            file=sys.stderr,
            flush=True,
        )


def _resolve(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    addresses = _resolve_all(name)
    return min(addresses, key=lambda address: address.version) if addresses else None


def _resolve_all(name: str) -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        return set()
    return {ipaddress.ip_address(str(info[4][0]).partition("%")[0]) for info in infos}


def _source_address(target: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """The address this host sends from to reach ``target`` (a UDP connect sends nothing)."""
    family = socket.AF_INET if target.version == 4 else socket.AF_INET6
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((str(target), 9))
        except OSError:
            return None
        return str(probe.getsockname()[0]).partition("%")[0]


def _interface_with(address: str) -> str | None:
    """The name of the interface holding ``address`` (Linux)."""
    wanted = ipaddress.ip_address(address)
    if wanted.version == 6:
        try:
            with open("/proc/net/if_inet6") as table:
                for line in table:
                    fields = line.split()
                    if ipaddress.ip_address(bytes.fromhex(fields[0])) == wanted:
                        return fields[-1]
        except OSError:
            return None
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                answer = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            if socket.inet_ntoa(answer[20:24]) == address:
                return name
    return None
