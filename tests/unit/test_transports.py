"""The two request paths of the platform client (httpx for the control plane, aiohttp for
trainers' data plane) give the same answers and raise the same typed errors, against a
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

    async def trickle(request: web.Request) -> web.StreamResponse:
        # An answer written slowly, never silent for long: 6 pieces 0.15 s apart.
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        for piece in ['{"a": ', "1", ", ", '"b"', ": 2", "}"]:
            await asyncio.sleep(0.15)
            await response.write(piece.encode())
        await response.write_eof()
        return response

    app = web.Application()
    for path, handler in [
        ("trickle", trickle),
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


async def test_silence_is_bounded_and_a_slow_answer_is_not_silence(
    trainer: TrainerClient,
) -> None:
    """``silence``: how long the peer may send nothing (the proxy's bound on a connection gone
    dark), not how long the answer takes: an answer written over 0.9 s in pieces 0.15 s apart
    passes a 0.5 s silence bound; a peer silent for 5 s does not."""
    with pytest.raises(errors.RequestTimeout):  # (it would answer after 5 s)
        await trainer.request("GET", "slow", timeout=30.0, silence=0.3)
    assert await trainer.request("GET", "trickle", silence=0.5) == {"a": 1, "b": 2}


async def _silent_first() -> tuple[web.AppRunner, str, list[dict[str, Any]]]:
    """A trainer whose first answer to each endpoint never comes (a connection gone dark)."""
    seen: list[dict[str, Any]] = []

    async def handler(request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        seen.append({"path": request.path, **body})
        if sum(1 for s in seen if s["path"] == request.path) == 1:
            await asyncio.sleep(30)
        if request.path.endswith("retrieve_future"):
            return web.json_response({"loss": 1.0})
        return web.json_response({"request_id": "r-1"})

    app = web.Application()
    app.router.add_route("POST", "/api/v1/{op}", handler)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}", seen


@pytest.mark.parametrize("transport", ["httpx", "aiohttp"])
async def test_a_data_plane_request_unanswered_for_the_silence_bound_is_sent_again(
    transport: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 32: a submission (the same body: the trainer dedupes on its seq_id) and a
    future's poll that go unanswered for ``DATA_PLANE_SILENCE_S`` are sent again, within the
    caller's deadline; without a deadline a request is sent once."""
    from shepherd.platform import client as module

    monkeypatch.setattr(module, "DATA_PLANE_SILENCE_S", 0.3)
    runner, url, seen = await _silent_first()
    client = PlatformClient(url, KEY, account_id="acct", timeout=10)
    data_plane = client.open_data_plane()
    trainer = client.trainer_at(url) if transport == "httpx" else TrainerClient(data_plane, url)
    try:
        body = {"model_id": "m", "seq_id": 7, "forward_backward_input": {"data": []}}
        async with asyncio.timeout(5):
            answer = await trainer.call("forward_backward", body, timeout=5)
        assert answer == {"loss": 1.0}
        assert [s["path"].rsplit("/", 1)[-1] for s in seen] == [
            "forward_backward",
            "forward_backward",
            "retrieve_future",
            "retrieve_future",
        ]
        assert seen[0] == seen[1]  # byte for byte the same submission
        seen.clear()
        with pytest.raises(errors.RequestTimeout):  # the deadline still holds
            await trainer.submit("optim_step", {"seq_id": 8}, deadline=0.2)
        assert len(seen) == 1
        # No connection at all: tried again (after a pause) until the deadline.
        with socket.socket() as sock:  # a port nothing listens on
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        gone = TrainerClient(trainer._t, f"http://127.0.0.1:{port}")  # noqa: SLF001
        started = asyncio.get_running_loop().time()
        with pytest.raises((errors.Unreachable, errors.RequestTimeout)):  # (the last: either)
            await gone.submit("optim_step", {"seq_id": 8}, deadline=1.2)
        assert asyncio.get_running_loop().time() - started >= 1.0  # not given up at once
    finally:
        await data_plane.aclose()
        await client.aclose()
        await runner.cleanup()


async def test_a_trainers_data_plane_goes_on_aiohttp_and_closes_with_its_client() -> None:
    """``PlatformClient.trainer``: every data-plane request on the cheaper path (a loop
    job's steps from the worker, like the proxy's), one pool per client, closed with it."""
    from shepherd.platform.aio import AiohttpTransport  # noqa: PLC0415

    runner, url = await _serve()
    try:
        client = PlatformClient(url, KEY, account_id="acct")
        first, second = await client.trainer("job-a"), await client.trainer("job-b")
        assert isinstance(first._t, AiohttpTransport)  # noqa: SLF001 - the path taken
        assert first._t is second._t  # noqa: SLF001
        pool = first._t  # noqa: SLF001
        with pytest.raises(errors.RouteNotFound):  # (no such route here: it went out)
            await first.request("GET", "healthz")
        assert pool._session is not None  # noqa: SLF001 - opened by that request
        await client.aclose()
        assert pool._session is None  # noqa: SLF001 - closed with the client
    finally:
        await runner.cleanup()
