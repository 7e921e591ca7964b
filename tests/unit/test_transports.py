"""The two request paths of the platform client (httpx for the control plane, aiohttp for
the proxy's data plane) give the same answers and raise the same typed errors, against a
real HTTP server on loopback."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from shepherd.platform import errors
from shepherd.platform.client import PlatformClient, TrainerClient

KEY = "fw-transport-test-key"


async def _serve() -> tuple[web.AppRunner, str]:
    async def ok(request: web.Request) -> web.Response:
        body = await request.read()
        return web.json_response(
            {
                "method": request.method,
                "query": dict(request.query),
                "body": json.loads(body) if body else None,
                "key": request.headers.get("X-Api-Key"),
                "bearer": request.headers.get("Authorization"),
            }
        )

    async def empty(request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def route_missing(request: web.Request) -> web.Response:
        return web.Response(status=404, text="no route")

    async def bad_gateway(request: web.Request) -> web.Response:
        return web.Response(status=502, text="<html>bad gateway</html>")

    async def conflict(request: web.Request) -> web.Response:
        error = {"code": 409, "status": "ALREADY_EXISTS", "message": "step-1 exists"}
        return web.json_response({"error": error}, status=409)

    async def not_json(request: web.Request) -> web.Response:
        return web.Response(status=200, text="{half")

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response({})

    app = web.Application()
    for path, handler in [
        ("ok", ok),
        ("empty", empty),
        ("missing", route_missing),
        ("bad", bad_gateway),
        ("conflict", conflict),
        ("not-json", not_json),
        ("slow", slow),
    ]:
        app.router.add_route("*", f"/api/v1/{path}", handler)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


@pytest.fixture(params=["httpx", "aiohttp"])
async def trainer(request: pytest.FixtureRequest) -> AsyncIterator[TrainerClient]:
    runner, url = await _serve()
    client = PlatformClient(url, KEY, account_id="acct")
    data_plane = client.open_data_plane()
    try:
        if request.param == "httpx":
            yield client.trainer_at(url)
        else:
            yield TrainerClient(data_plane, url)
    finally:
        await data_plane.aclose()
        await client.aclose()
        await runner.cleanup()


async def test_an_answer_with_credentials_query_and_body(trainer: TrainerClient) -> None:
    answer: dict[str, Any] = await trainer.request(
        "POST", "ok", {"seq_id": 3, "x": [1.5, 2]}, params={"a": 1, "skip": None}
    )
    assert answer == {
        "method": "POST",
        "query": {"a": "1"},
        "body": {"seq_id": 3, "x": [1.5, 2]},
        "key": KEY,
        "bearer": f"Bearer {KEY}",
    }
    assert await trainer.request("GET", "empty") == {}


@pytest.mark.parametrize(
    ("path", "kind", "code"),
    [
        ("missing", errors.RouteNotFound, 404),  # the data plane's 404: ask the control plane
        ("bad", errors.Unavailable, 502),
        ("conflict", errors.AlreadyExists, 409),
        ("not-json", errors.InvalidArgument, 200),
    ],
)
async def test_the_same_typed_errors(
    trainer: TrainerClient, path: str, kind: type[errors.PlatformError], code: int
) -> None:
    with pytest.raises(errors.PlatformError) as caught:
        await trainer.request("POST", path, {})
    assert type(caught.value) is kind
    assert caught.value.status_code == code
    assert caught.value.url == f"/api/v1/{path}"
    assert KEY not in str(caught.value)


async def test_a_timeout_and_a_refused_connection_are_retryable(trainer: TrainerClient) -> None:
    with pytest.raises(errors.RequestTimeout) as timed_out:
        await trainer.request("GET", "slow", timeout=0.2)
    assert timed_out.value.retryable
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    gone = TrainerClient(trainer._t, f"http://127.0.0.1:{port}")  # noqa: SLF001 - same path
    with pytest.raises(errors.Unavailable) as refused:
        await gone.request("GET", "ok")
    assert refused.value.retryable
    assert KEY not in str(refused.value)
