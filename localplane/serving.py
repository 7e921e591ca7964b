"""One uvicorn server flavour for the plane and its trainers: it calls back once it is
listening, and a shutdown asked for by SIGINT/SIGTERM exits with status 0 (uvicorn would
re-raise the signal, which reads as a crash to supervisors)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Generator

import uvicorn

#: How long an idle keep-alive connection stays open. Longer than every client's pool keeps
#: one (httpx 5 s, the proxy's aiohttp 4 s): the client then always drops an idle
#: connection first. With uvicorn's default (5 s, the same as httpx's) a request sent on a
#: connection just as the server closed it failed with "Server disconnected without sending
#: a response" — a flake in the suite, and a spurious 502 through the gateway. 75 s is what
#: nginx and most load balancers keep.
KEEP_ALIVE_S = 75


def config(app: object, **options: object) -> uvicorn.Config:
    """The uvicorn configuration the plane and its trainers share."""
    return uvicorn.Config(app, timeout_keep_alive=KEEP_ALIVE_S, **options)  # type: ignore[arg-type]


class ReadyServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, on_ready: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_ready = on_ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if not self.should_exit:
            self._on_ready()

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        with super().capture_signals():
            try:
                yield
            finally:
                self._captured_signals.clear()


def bind(host: str, port: int) -> socket.socket:
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted connections only for
    # sockets that say so, and without it every answer waits ~40 ms for a delayed ACK.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    return sock
