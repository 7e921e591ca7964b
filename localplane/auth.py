"""Where an API key travels (trainer-api.md §1): ``X-Api-Key: <key>`` — what the Fireworks
and Tinker SDKs send — or ``Authorization: Bearer <key>``. The control plane, the gateway
and every trainer read it the same way, through :func:`api_key`.

Keys localplane mints start with ``tml-``: the Tinker SDK refuses any other key (it checks
client-side), the Fireworks SDK takes any. A ``tml-`` key makes the Fireworks
``FiretitanServiceClient`` act as a plain Tinker client, though, so the dev key made at first
start keeps the Fireworks style (no ``tml-``), and ``--api-key`` is taken as given.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping

#: Key styles :func:`mint` knows: Tinker-style keys are accepted by both SDKs.
KEY_PREFIXES = {"tinker": "tml-", "fireworks": "fw_"}


def api_key(headers: Mapping[str, str]) -> str | None:
    """The key a request carries, or None. ``X-Api-Key`` wins when both are sent."""
    key = headers.get("x-api-key")
    if key and key.strip():
        return key.strip()
    auth = headers.get("authorization") or ""
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return None


def mint(style: str = "tinker") -> str:
    """A new random key of the given style (``tinker``: ``tml-…``; ``fireworks``: ``fw_…``)."""
    return KEY_PREFIXES[style] + secrets.token_urlsafe(24)
