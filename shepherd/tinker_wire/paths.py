"""The Tinker API's endpoints as a server finds them: route patterns relative to
``{base}/api/v1/`` (``session/{session_id}``, ``{path:path}`` for a rest-of-path parameter)
and the route of a request — one matcher for the trainer's table and the proxy's, each
raising its own errors for a path it does not serve."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

H = TypeVar("H")


@dataclass(frozen=True)
class Route(Generic[H]):
    method: str
    pattern: str
    #: The operation's name (localplane's ``x-localplane-op`` header and request counters).
    op: str
    handler: H

    def regex(self) -> re.Pattern[str]:
        parts = []
        for segment in self.pattern.split("/"):
            m = re.fullmatch(r"\{(\w+)(:path)?\}", segment)
            if m is None:
                parts.append(re.escape(segment))
            else:
                parts.append(f"(?P<{m[1]}>{'.+' if m[2] else '[^/]+'})")
        return re.compile("/".join(parts) + r"\Z")


class RouteTable(Generic[H]):
    """Routes, compiled once."""

    def __init__(self, routes: Iterable[Route[H]]) -> None:
        self.routes = list(routes)
        self._compiled = [(route, route.regex()) for route in self.routes]
        #: What is served, for an unknown endpoint's error.
        self.served = ", ".join(sorted({f"{r.method} {r.pattern}" for r in self.routes}))

    def find(self, method: str, path: str) -> tuple[Route[H], dict[str, str]] | list[str]:
        """The route of ``method path`` and its parameters; else the methods the path is
        served with (empty: no such endpoint)."""
        allowed: set[str] = set()
        for route, regex in self._compiled:
            m = regex.match(path)
            if m is None:
                continue
            if route.method == method:
                return route, m.groupdict()
            allowed.add(route.method)
        return sorted(allowed)

    def allowed(self, path: str) -> list[str]:
        return sorted({r.method for r, regex in self._compiled if regex.match(path)})
