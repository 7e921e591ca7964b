"""The one error the wire codecs raise."""

from __future__ import annotations


class WireError(ValueError):
    """A body that cannot be read as the Tinker API defines it; the message names the field.

    ``code`` and ``status`` say how an HTTP server answers it when the problem is the request
    as a whole (a 400 ``INVALID_ARGUMENT``, or a 415 for a media type it cannot read); a
    trainer that finds the problem inside a submitted operation fails that operation's
    future instead (category ``user``).
    """

    def __init__(self, message: str, *, code: int = 400, status: str = "INVALID_ARGUMENT") -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
