"""Listening sockets: the one place rollgym binds a port.

A launcher binds every server's socket before any server starts and hands each socket to its
process, so all URLs are known up front and no other process can take a port in between.
"""

from __future__ import annotations

import ipaddress
import socket

BACKLOG = 4096
"""Listen backlog: a collector opens thousands of connections at once when a run starts."""

WILDCARD = ("0.0.0.0", "::", "")


def is_loopback(host: str) -> bool:
    """``host`` is this machine only (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A TCP socket listening on ``host:port`` (0: a free port the OS picks); ``OSError`` if
    the address cannot be bound."""
    # IPPROTO_TCP stated explicitly: asyncio sets TCP_NODELAY on accepted connections only
    # then, and without it Nagle's algorithm adds ~40 ms to every small request.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def socket_url(sock: socket.socket, url_host: str | None = None) -> str:
    """``http://host:port`` of a listening socket. ``url_host`` replaces a wildcard bound host
    (no client connects to 0.0.0.0 by design); without it, loopback: this machine's clients."""
    host, port = sock.getsockname()[:2]
    if host in WILDCARD:
        host = url_host or "127.0.0.1"
    return f"http://{host}:{port}"
