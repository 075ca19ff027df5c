"""The ``dead_url`` fixture: a URL where nothing listens stays so for the whole test, whatever
else runs on the machine. A port bound and closed again did not (issue 36, item 10: a Ray run
beside other rollgym processes found something answering at its "dead" agent URL)."""

from __future__ import annotations

import errno
import socket
import subprocess
import sys
from collections.abc import Callable
from urllib.parse import urlsplit

import pytest

from tests.support.servers import port_of

pytestmark = pytest.mark.timeout(30)

# Another process tries every way it could take the port: with and without SO_REUSEADDR, on
# the loopback address and on the wildcard one; it prints what it got for each.
TAKE = """
import socket, sys
port = int(sys.argv[1])
for host in ("127.0.0.1", "0.0.0.0"):
    for reuse in (0, 1):
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, reuse)
            try:
                sock.bind((host, port))
                sock.listen()
                print(host, reuse, "listening")
            except OSError as exc:
                print(host, reuse, exc.errno)
"""


def test_a_dead_urls_port_cannot_be_taken_by_another_process(dead_url: Callable[[], str]) -> None:
    port = port_of(dead_url())
    done = subprocess.run(
        [sys.executable, "-c", TAKE, str(port)], capture_output=True, text=True, timeout=20
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"{host} {reuse} {errno.EADDRINUSE}"
        for host in ("127.0.0.1", "0.0.0.0")
        for reuse in (0, 1)
    ], done.stdout


def test_a_dead_url_refuses_connections_at_once(dead_url: Callable[[], str]) -> None:
    url = urlsplit(dead_url())
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((url.hostname, url.port), timeout=5).close()


def test_each_dead_url_is_a_port_of_its_own(dead_url: Callable[[], str]) -> None:
    assert len({port_of(dead_url()) for _ in range(3)}) == 3
