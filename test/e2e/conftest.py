"""Fixtures of the e2e tooling's CPU tests."""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest


@pytest.fixture
def time_wait_port() -> Callable[..., int]:
    """Make a loopback port whose only socket is in TIME_WAIT: a server's
    side of a connection that the server closed first, the listener gone
    (what a stopped server leaves). Its listener sets SO_REUSEADDR, as
    asyncio's ``create_server`` (SGLang's HTTP server) does, unless
    ``reuse`` is off."""

    def make(reuse: bool = True) -> int:
        lst = socket.socket()
        if reuse:
            lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lst.bind(("127.0.0.1", 0))
        lst.listen()
        port = lst.getsockname()[1]
        cli = socket.create_connection(("127.0.0.1", port))
        conn, _ = lst.accept()
        conn.close()  # the server closes first: its end goes to TIME_WAIT
        assert cli.recv(1) == b""  # its FIN arrived
        cli.close()
        lst.close()
        return port

    return make
