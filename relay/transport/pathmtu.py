"""``max_datagram_size = "auto"``: the largest UDP payload the route to a peer allows.

The route's MTU is what ``ip route get`` reports: a UDP socket connected to the peer (connect
sends nothing) answers IP_MTU / IPV6_MTU with its route's MTU, including what the kernel
learnt from ICMP "fragmentation needed" since. Minus the IP and UDP headers (IPv4 28,
IPv6 48) that is the payload a datagram may carry without fragmenting on the first hop, up
to ``limit`` (the transport's cap). Where nothing is known (no route, not Linux) it is 1200,
the size every QUIC path carries. Only the first hop is known this way: a smaller MTU
further on is the risk docs/transport.md ("Datagram size") describes.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

AUTO = "auto"
SAFE_DATAGRAM_SIZE = 1200  # RFC 9000 14: every QUIC path carries it
_IP_MTU = getattr(socket, "IP_MTU", 14)  # linux/in.h
_IPV6_MTU = getattr(socket, "IPV6_MTU", 24)  # linux/in6.h
_HEADERS = {socket.AF_INET: 20 + 8, socket.AF_INET6: 40 + 8}


def route_mtu(addr: Any) -> tuple[int, int] | None:
    """(address family, MTU of the route to ``addr``), or None where it cannot be read."""
    host, port = addr[0], addr[1]
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip, host = ip.ipv4_mapped, str(ip.ipv4_mapped)  # a dual-stack socket's IPv4 peer
    if isinstance(ip, ipaddress.IPv4Address):
        family, level, opt, target = socket.AF_INET, socket.IPPROTO_IP, _IP_MTU, (host, port)
    else:
        family, level, opt, target = socket.AF_INET6, socket.IPPROTO_IPV6, _IPV6_MTU, tuple(addr)
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(target)
            return family, s.getsockopt(level, opt)
    except OSError:  # no route, or no IP_MTU (not Linux)
        return None


def path_datagram_size(addr: Any, limit: int) -> int:
    """The UDP payload size ``auto`` means towards ``addr``: the route's MTU minus the IP
    and UDP headers, at most ``limit``; 1200 where the route says nothing."""
    found = route_mtu(addr)
    if found is None:
        return SAFE_DATAGRAM_SIZE
    family, mtu = found
    return max(SAFE_DATAGRAM_SIZE, min(limit, mtu - _HEADERS[family]))
