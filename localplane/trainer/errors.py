"""The trainer's error kinds.

* An HTTP error (the request cannot even be accepted: no such model, a malformed body) is a
  :class:`~localplane.errors.PlaneError`, answered at once with its status.
* Anything wrong with the work itself fails the operation's *future*: :class:`UserError`
  (and the codecs' :class:`~shepherd.tinker_wire.errors.WireError`, and a backend's
  ``ValueError``) with category ``user``; anything else with category ``server`` (a bug).

Never a 404: on the data plane a 404 means "no route to this job" (trainer-api.md §5).
"""

from __future__ import annotations

from localplane.errors import bounded_message


class UserError(Exception):
    """A request the trainer cannot apply as sent; the message names the field."""

    def __init__(self, message: str) -> None:
        super().__init__(bounded_message(message))
