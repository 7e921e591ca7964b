"""Request holds (fault injection, admin only): keep chosen requests waiting until released.

A test that must act while a particular call is in flight — cancel a job while its trainer's
``optim_step`` is pending, or while a promotion is being made — adds a hold for that call
(``POST /admin/v1/holds {"method": "POST", "path": "<regex>", "count": 1}``), waits until
``GET /admin/v1/holds`` shows the request held, acts, and releases it
(``POST /admin/v1/holds/{id}:release``). A held request has not reached the control plane or
the trainer yet: released, it goes on as if it had been slow; if its client has given up
meanwhile (it disconnected), it is dropped, as a load balancer drops a request whose client
left. Holds apply to every account's requests, control plane and gateway alike (``path`` is
matched against the URL path with ``re.search``); admin requests are never held.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from dataclasses import dataclass, field
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: A held request is let go after this long even if nobody releases it: a test that forgot
#: its hold must not leave a request (and its client's activity) waiting forever.
MAX_HOLD_S = 300.0
#: Holds kept at once; more is a test's bug.
MAX_HOLDS = 64


@dataclass
class Hold:
    id: str
    path: re.Pattern[str]
    method: str | None
    #: How many more requests this hold catches.
    remaining: int
    #: Requests caught so far, and how many of them are waiting now.
    caught: int = 0
    waiting: int = 0
    released: asyncio.Event = field(default_factory=asyncio.Event)

    def wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "path": self.path.pattern,
            "method": self.method,
            "remaining": self.remaining,
            "caught": self.caught,
            "waiting": self.waiting,
            "released": self.released.is_set(),
        }


class Holds:
    def __init__(self) -> None:
        self._holds: dict[str, Hold] = {}
        self._ids = itertools.count(1)

    def add(self, body: Any) -> Hold:
        from localplane.errors import InvalidArgument, ResourceExhausted

        if not isinstance(body, dict):
            raise InvalidArgument("request body must be a JSON object")
        path, method, count = body.get("path"), body.get("method"), body.get("count", 1)
        if not isinstance(path, str) or not path or len(path) > 500:
            raise InvalidArgument("path: is required, a regular expression of at most 500 chars")
        try:
            pattern = re.compile(path)
        except re.error as exc:
            raise InvalidArgument(f"path: not a regular expression ({exc})") from None
        if method is not None and (not isinstance(method, str) or not method.isalpha()):
            raise InvalidArgument("method: must be an HTTP method such as POST, or null")
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 1000:
            raise InvalidArgument("count: must be an integer from 1 to 1000")
        if len(self._holds) >= MAX_HOLDS:
            raise ResourceExhausted(f"at most {MAX_HOLDS} holds at once; release some")
        hold = Hold(
            id=f"hold-{next(self._ids)}",
            path=pattern,
            method=method.upper() if method else None,
            remaining=count,
        )
        self._holds[hold.id] = hold
        return hold

    def list(self) -> list[dict[str, Any]]:
        return [h.wire() for h in self._holds.values()]

    def release(self, hold_id: str) -> dict[str, Any]:
        from localplane.errors import NotFound

        hold = self._holds.pop(hold_id, None)
        if hold is None:
            raise NotFound(f"no hold {hold_id}")
        hold.released.set()
        return hold.wire()

    def release_all(self) -> None:
        for hold_id in list(self._holds):
            self.release(hold_id)

    def catch(self, method: str, path: str) -> Hold | None:
        if path.startswith("/admin/"):
            return None
        for hold in self._holds.values():
            if hold.remaining > 0 and (hold.method in (None, method)) and hold.path.search(path):
                hold.remaining -= 1
                hold.caught += 1
                return hold
        return None


class HoldRequests:
    """ASGI middleware: a request a hold catches waits for its release before it is served."""

    def __init__(self, app: ASGIApp, holds: Holds) -> None:
        self.app = app
        self.holds = holds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hold = self.holds.catch(scope["method"], scope["path"]) if scope["type"] == "http" else None
        if hold is None:
            await self.app(scope, receive, send)
            return
        # Read the body while waiting, so a client that gives up is seen (its disconnect).
        body: list[Message] = []
        gone = asyncio.Event()

        async def read() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    gone.set()
                    return
                body.append(message)
                if not message.get("more_body", False):
                    # The whole body is in; the next receive() only tells of a disconnect.
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        gone.set()
                    return

        reader = asyncio.ensure_future(read())
        hold.waiting += 1
        try:
            waits = [
                asyncio.ensure_future(hold.released.wait()),
                asyncio.ensure_future(gone.wait()),
            ]
            _, pending = await asyncio.wait(
                waits, timeout=MAX_HOLD_S, return_when=asyncio.FIRST_COMPLETED
            )
            for task in pending:
                task.cancel()
        finally:
            hold.waiting -= 1
        if gone.is_set():
            reader.cancel()
            return  # the client left: the request never reaches the service
        if not reader.done():
            reader.cancel()
        queued = list(body)

        async def replay() -> Message:
            if queued:
                return queued.pop(0)
            return await receive()

        await self.app(scope, replay, send)
