"""Hosts for partition tests and benchmarks (issue 32): a network namespace of its own, joined
to ours by a veth pair — traffic only between the two ends (and each side's loopback); a
localplane runs there with ``PlaneProcess(prefix=host.prefix())``. A cut takes the far end of
the pair down: packets are dropped, nothing is refused (a black hole, as a real partition is;
``tc netem`` is not available on these machines). Needs root and ``ip`` (iproute2)."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass


def unavailable() -> str | None:
    """Why this machine cannot make hosts (None: it can)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return "network namespaces need root and iproute2 (ip)"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@dataclass
class Host:
    """A namespace ``name``; its end of the pair (``far``, address ``far_ip``) and ours
    (``near``, ``near_ip``); with ``watch``, a second pair that is never cut (``watch_ip``:
    the host's address on it), for an observer that must see across a cut."""

    name: str
    near: str
    far: str
    near_ip: str
    far_ip: str
    watch_ip: str | None = None

    def prefix(self) -> list[str]:
        """Run a command on the host: ``[*prefix, cmd...]``."""
        return ["ip", "netns", "exec", self.name]

    def cut(self) -> None:
        _ip("netns", "exec", self.name, "ip", "link", "set", self.far, "down")

    def heal(self) -> None:
        _ip("netns", "exec", self.name, "ip", "link", "set", self.far, "up")


@contextlib.contextmanager
def host(*, watch: bool = False) -> Iterator[Host]:
    """A host, removed (with its ends of the pairs, and so the pairs) after."""
    if why := unavailable():
        raise RuntimeError(why)
    token = uuid.uuid4().hex[:6]
    # A /30 of its own in 10.100-249.x (parallel test processes pick apart by chance).
    a, b = random.randrange(100, 250), random.randrange(0, 256)  # noqa: S311 - not a secret
    h = Host(f"shp-{token}", f"shn{token}", f"shf{token}", f"10.{a}.{b}.1", f"10.{a}.{b}.2")
    pairs = [(h.near, h.far, h.near_ip, h.far_ip)]
    if watch:
        h.watch_ip = f"10.{a}.{b}.6"
        pairs.append((f"swn{token}", f"swf{token}", f"10.{a}.{b}.5", h.watch_ip))
    try:
        _ip("netns", "add", h.name)
        inside = ["netns", "exec", h.name, "ip"]
        _ip(*inside, "link", "set", "lo", "up")
        for near, far, near_ip, far_ip in pairs:
            _ip("link", "add", near, "type", "veth", "peer", "name", far)
            _ip("link", "set", far, "netns", h.name)
            _ip("addr", "add", f"{near_ip}/30", "dev", near)
            _ip("link", "set", near, "up")
            _ip(*inside, "addr", "add", f"{far_ip}/30", "dev", far)
            _ip(*inside, "link", "set", far, "up")
        yield h
    finally:
        subprocess.run(["ip", "netns", "del", h.name], check=False, capture_output=True)
        for near, *_ in pairs:
            subprocess.run(["ip", "link", "del", near], check=False, capture_output=True)
