"""HMAC signatures of webhook deliveries (localplane extension, trainer-api.md §6).

Header ``X-Localplane-Signature: t=<unix seconds>,v1=<hex>`` where ``v1`` is
HMAC-SHA256(secret, ``"<t>." + raw body``). The timestamp bounds replays.
"""

from __future__ import annotations

import hashlib
import hmac
import time

SIGNATURE_HEADER = "X-Localplane-Signature"
EVENT_ID_HEADER = "X-Localplane-Event-Id"
DEFAULT_TOLERANCE_S = 300.0


class InvalidSignature(ValueError):
    """The delivery is not signed with the shared secret, or is too old."""


def _digest(secret: str, timestamp: int, body: bytes) -> str:
    message = str(timestamp).encode() + b"." + body
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def sign(secret: str, body: bytes, *, timestamp: int | None = None) -> str:
    """The signature header value for ``body``."""
    t = int(time.time()) if timestamp is None else timestamp
    return f"t={t},v1={_digest(secret, t, body)}"


def verify(
    secret: str,
    header: str | None,
    body: bytes,
    *,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
    now: float | None = None,
) -> None:
    """Raise :class:`InvalidSignature` unless ``header`` signs ``body`` with ``secret``."""
    if not header:
        raise InvalidSignature(f"missing {SIGNATURE_HEADER} header")
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    try:
        t = int(parts["t"])
        given = parts["v1"]
    except (KeyError, ValueError):
        raise InvalidSignature("malformed signature header") from None
    current = time.time() if now is None else now
    if abs(current - t) > tolerance_s:
        raise InvalidSignature("signature timestamp outside the tolerance window")
    if not hmac.compare_digest(given, _digest(secret, t, body)):
        raise InvalidSignature("signature does not match")
