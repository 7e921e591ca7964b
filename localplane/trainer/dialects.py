"""The two wire dialects of the Tinker API (trainer-api.md §4) and the one canonical form.

The service only ever sees the JSON dialect's body (a dict) and produces JSON-dialect
results. Protobuf — what the ``tinker`` SDK sends for ``forward_backward`` and wants back for
forward/backward and sampling results — is translated here by
:mod:`localplane.trainer.proto_dialect`, imported lazily: without it a protobuf request
gets a 415 naming the problem, and the JSON dialect works alone.

Result encoding: protobuf only when the ``Accept`` header names ``application/x-protobuf``
and not ``application/json``. The tinker SDK accepts protobuf only; the Fireworks fork
accepts both and gets JSON, as hosted RLOR trainers answer it.
"""

from __future__ import annotations

import json
from types import ModuleType
from typing import Any

from localplane.errors import InvalidArgument, PlaneError

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
#: Every trainer answer names its operation and dialect; the gateway counts them by these.
OP_HEADER = "x-localplane-op"
DIALECT_HEADER = "x-localplane-dialect"


class UnsupportedMediaType(PlaneError):
    code, status = 415, "INVALID_ARGUMENT"


def _proto() -> ModuleType | None:
    try:
        from localplane.trainer import proto_dialect  # noqa: PLC0415  # optional, lazily
    except ImportError:
        return None
    return proto_dialect


def _media(value: str | None) -> str:
    return (value or "").split(";", 1)[0].strip().lower()


def decode_request(op: str, content_type: str | None, body: bytes) -> tuple[dict[str, Any], str]:
    """The canonical (JSON-dialect) body of a request, and the dialect it came in."""
    if _media(content_type) == PROTOBUF:
        proto = _proto()
        if proto is None:
            raise UnsupportedMediaType(
                f"{op}: this trainer cannot read application/x-protobuf requests "
                "(localplane.trainer.proto_dialect is not installed); send JSON"
            )
        try:
            return proto.decode_request(op, body), "protobuf"
        except PlaneError:
            raise
        except Exception as exc:
            raise InvalidArgument(f"{op}: not a valid protobuf request: {exc}") from None
    if not body.strip():
        return {}, "json"
    try:
        parsed = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise InvalidArgument(f"{op}: the request body is not valid JSON") from None
    except RecursionError:
        raise InvalidArgument(f"{op}: the request body is JSON nested too deeply") from None
    except ValueError:  # an integer longer than Python converts (sys.get_int_max_str_digits)
        raise InvalidArgument(f"{op}: a JSON number in the request has too many digits") from None
    if not isinstance(parsed, dict):
        raise InvalidArgument(f"{op}: the request body must be a JSON object")
    return parsed, "json"


def wants_protobuf(accept: str | None) -> bool:
    media = {_media(part) for part in (accept or "").split(",")}
    return PROTOBUF in media and JSON not in media


def encode_result(op: str, result: dict[str, Any], accept: str | None) -> tuple[bytes, str]:
    """A result's payload and media type, in the dialect the client asked for."""
    if wants_protobuf(accept):
        proto = _proto()
        if proto is not None and proto.can_encode(op):
            return proto.encode_result(op, result), PROTOBUF
    return json.dumps(result, separators=(",", ":")).encode(), JSON
