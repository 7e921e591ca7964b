"""The data plane's request path on aiohttp: the same contract as
:class:`~shepherd.platform.client.JsonTransport` (auth headers, typed errors, JSON
decoding), at about half its cost per request.

Every trainer request goes this way (``PlatformClient.trainer``): Shepherd's data-plane
proxy sends four or five for every step of a program, two of them on the step's critical
path, and a loop job's training activity as many from the worker; on a 2-core machine an
httpx round trip over loopback costs ~0.9 ms of CPU and an aiohttp one ~0.45 ms
(``bench/proxy.py`` shows the proxy's CPU per step). The control plane stays on httpx: its
calls are few.
"""

from __future__ import annotations

import contextlib
import json
import ssl
from collections.abc import Mapping
from typing import Any

import aiohttp

from shepherd.platform.errors import error_from_status, transport_failure

#: Idle seconds a pooled connection is kept (see :meth:`AiohttpTransport._open`).
KEEP_ALIVE_S = 4.0


class AiohttpTransport:
    """One connection pool to the gateway; :meth:`aclose` it when done. Build it with
    :meth:`PlatformClient.open_data_plane`, which gives it the client's credentials."""

    def __init__(
        self,
        headers: Mapping[str, str],
        *,
        timeout: float,
        connect_timeout: float,
        max_connections: int = 100,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._headers = dict(headers)
        #: The control plane's CA bundle too (httpx's: certifi), not the system's.
        self._ssl: ssl.SSLContext | bool = ssl_context if ssl_context is not None else True
        self._timeout = timeout
        self._connect_timeout = connect_timeout
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:  # never the key
        return "AiohttpTransport()"

    def _open(self) -> aiohttp.ClientSession:
        # Made on first use: a ClientSession belongs to the event loop it was made in.
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                # An idle connection is dropped after 4 s (aiohttp keeps one 15 s): before
                # a server with uvicorn's default keep-alive (5 s) closes it under a request.
                connector=aiohttp.TCPConnector(
                    limit=self._max_connections, keepalive_timeout=KEEP_ALIVE_S, ssl=self._ssl
                ),
                cookie_jar=aiohttp.DummyCookieJar(),
                trust_env=False,
            )
        return self._session

    async def request(
        self,
        method: str,
        url: str,
        *,
        params: Mapping[str, Any] | None = None,
        json_body: Any = None,
        data_plane: bool = False,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
        silence: float | None = None,
    ) -> Any:
        query = {k: str(v) for k, v in (params or {}).items() if v is not None}
        data = None if json_body is None else json.dumps(json_body).encode()
        sent = dict(headers or {})
        if data is not None:
            sent["Content-Type"] = "application/json"
        limit = aiohttp.ClientTimeout(
            total=timeout if timeout is not None else self._timeout,
            connect=self._connect_timeout,
            # Counted from the request's last byte written, reset by each read: silence
            # from the peer, not an upload's length.
            sock_read=silence,
        )
        try:
            async with self._open().request(
                method, url, params=query or None, data=data, headers=sent, timeout=limit
            ) as response:
                content = await response.read()
                code, reason = response.status, response.reason or ""
                path = response.url.raw_path_qs
        except (TimeoutError, aiohttp.ClientError) as exc:
            path = url.split("://", 1)[-1].partition("/")[2]
            raise transport_failure(
                exc,
                timed_out=isinstance(exc, TimeoutError),
                method=method,
                url=f"/{path}",
            ) from None
        if code < 400:
            if not content:
                return {}
            with contextlib.suppress(json.JSONDecodeError, UnicodeDecodeError):
                return json.loads(content)
        # A refusal, or a 2xx that is not JSON: typed by its code and body.
        raise error_from_status(
            code, content, reason=reason, method=method, url=path, data_plane=data_plane
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
