"""Listening sockets: bound on a free port, a taken port refused, URLs a client can use."""

from __future__ import annotations

import socket

import pytest

from rollgym.launch.ports import bind_socket, socket_url

pytestmark = pytest.mark.timeout(10)


def test_bind_socket_listens_on_a_free_port_a_client_can_reach() -> None:
    with bind_socket() as sock:
        host, port = sock.getsockname()[:2]
        assert host == "127.0.0.1" and port > 0
        with socket.create_connection((host, port), timeout=5):
            conn, _ = sock.accept()
            conn.close()
        assert socket_url(sock) == f"http://127.0.0.1:{port}"


def test_a_taken_port_is_an_os_error() -> None:
    with bind_socket() as taken:
        port = taken.getsockname()[1]
        with pytest.raises(OSError):
            bind_socket("127.0.0.1", port)


def test_a_wildcard_bind_gets_a_host_clients_can_connect_to() -> None:
    with bind_socket("0.0.0.0") as sock:
        port = sock.getsockname()[1]
        assert socket_url(sock) == f"http://127.0.0.1:{port}"
        assert socket_url(sock, "10.1.2.3") == f"http://10.1.2.3:{port}"


def test_production_code_never_imports_the_test_helpers() -> None:
    import ast
    from pathlib import Path

    import rollgym

    root = Path(rollgym.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        if path.name == "testing.py" and path.parent == root:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            if any(n == "rollgym.testing" or n.startswith("rollgym.testing.") for n in names):
                offenders.append(str(path.relative_to(root)))
    assert offenders == []
