"""Which address and network interface a node uses, found from the node's own routes, never assumed.

A worker tells the controller the address other nodes reach it at (the rendezvous of the jobs whose rank 0
it runs). Unless configured, that is the address its own traffic to the controller leaves from: the kernel's
route choice (a UDP ``connect`` sends nothing). On one machine that is 127.0.0.1, as before; on a cluster it
is the node's address on the controller's network, where a hard-coded 127.0.0.1 made other nodes dial
themselves.

Communication libraries pick an interface of their own when not told, and some pick loopback (Gloo falls
back to ``lo`` when the host name does not resolve, Horovod was given ``lo``): ``interface_of`` names the
interface that carries an address, so the launchers point them at the one the rendezvous uses.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct

_SIOCGIFADDR = 0x8915  # <linux/sockios.h>: an interface's IPv4 address
_SIOCGIFNETMASK = 0x891B  # and its netmask


def address_towards(peer: str) -> str:
    """The local address this node's traffic to ``peer`` (``HOST:PORT``) leaves from. Raises ``OSError`` when
    no route leads there (the message names the peer)."""
    host, _, port = peer.rpartition(":")
    host = host.strip("[]") or peer
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((host, int(port) if port.isdigit() else 9))
            return s.getsockname()[0]
    except OSError as e:
        raise OSError(e.errno, f"no route from this node to the controller {peer}: {e.strerror}") from None


def interface_of(address: str) -> str | None:
    """The name of the interface that holds the IPv4 ``address`` (``lo`` for 127.0.0.1), or None when no
    interface here holds it (an IPv6 or a name: the caller leaves the library's own choice)."""
    try:
        want = ipaddress.IPv4Address(address)
    except ValueError:
        return None
    for _, name in socket.if_nameindex():
        have = _ipv4(name)
        if have is not None and (have == want or (want.is_loopback and have.is_loopback)):
            return name
    return None


def holds_exactly(address: str) -> bool:
    """Whether an interface here holds exactly the IPv4 ``address``: Open MPI's test of "this node" (127.0.0.12
    on a machine whose ``lo`` holds 127.0.0.1 is another node to it, though the kernel routes it here)."""
    try:
        want = ipaddress.IPv4Address(address)
    except ValueError:
        return False
    return any(_ipv4(name) == want for _, name in socket.if_nameindex())


def subnet_of(address: str) -> str | None:
    """The IPv4 network (``10.213.5.0/24``) of the interface holding ``address``: how Open MPI is told which
    interface to use when interface names differ between hosts. None as for ``interface_of``."""
    name = interface_of(address)
    if name is None:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            req = fcntl.ioctl(s.fileno(), _SIOCGIFNETMASK, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    mask = ipaddress.IPv4Address(req[20:24])
    return str(ipaddress.IPv4Network(f"{address}/{mask}", strict=False))


def _ipv4(name: str) -> ipaddress.IPv4Address | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            req = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:  # no IPv4 address on it (or down)
            return None
    return ipaddress.IPv4Address(req[20:24])


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (an address or a name) is reachable from this machine only."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        found = {ai[4][0] for ai in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return bool(found) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in found)


def spare_port(host: str) -> int:
    """A port free on every address of this node (torchrun's store listens on all: one free on ``host`` alone could
    be a client connection's on 127.0.0.1, EADDRINUSE at the launch), for the next job's rendezvous."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind(("::" if ":" in host else "", 0))
        return s.getsockname()[1]
