"""A line written for a terminal, made fit to read anywhere: in ``shepherd logs``, a pipe, a
file, a JSON record. Programs write for their own terminal (rich's and colorama's colours,
tqdm's progress bars redrawn in place with ``\\r``, cursor moves); replayed as text those are
raw escapes that garble the reader's terminal, or a line of a hundred bar states.

:func:`readable` keeps what the program's terminal would have ended up showing:

- escape sequences (ECMA-48: colours, cursor moves, erases, window titles, hyperlinks) are
  removed; the ones that send the cursor back to the line's start (``ESC [ G``, ``ESC [ 2K``)
  count as a carriage return;
- a line redrawn with ``\\r`` shows its last non-blank state. Progress bars redraw the whole
  line each time (tqdm pads, rich erases first), so that state is the bar's final one; a bar
  cleared at the end (``leave=False``) keeps its last state, which says more than a blank;
- control characters still left (a bell, a backspace, a lone ESC, a C1 control, the Unicode
  bidirectional overrides that reorder what a terminal shows) are written visibly, as Python
  writes them in a string's repr (``\\x07``, ``\\u202e``). Tabs and line breaks stay. U+FFFD,
  which stands for bytes that were not UTF-8, is printable and stays.
"""

from __future__ import annotations

import re

#: Escape sequences that return the cursor to the line's start: CHA to column 1
#: (``ESC [ G``, ``ESC [ 1 G``) and erase-the-whole-line (``ESC [ 2 K``), whose text after is
#: written over the line as after a carriage return. (``\x9b`` is CSI's 8-bit form.)
_LINE_RESET = re.compile(r"(?:\x1b\[|\x9b)(?:[01]?G|2K)")

#: Every other escape sequence, longest forms first: control strings (OSC such as titles and
#: hyperlinks; DCS, SOS, PM, APC) up to their BEL or ST terminator; CSI sequences (colours,
#: cursor moves, erases, modes); then the two-or-more-byte escapes (``ESC ( B``, ``ESC 7``),
#: but not through a space: an ESC a program wrote alone, before a word, leaves the word be.
_ESCAPE = re.compile(
    r"(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)"
    r"|(?:\x1b\[|\x9b)[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]"
    r"|\x1b[\x21-\x2f]*[\x30-\x7e]"
)

#: What a terminal would act on instead of show: C0 controls (but tab and line feed), DEL, C1
#: controls, the line and paragraph separators, and the bidirectional embeddings, overrides
#: and isolates (which can make a line read other than it is).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match[0])
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def _final_state(line: str) -> str:
    """What is left of a line redrawn with carriage returns: its last non-blank state."""
    states = line.split("\r")
    return next((state for state in reversed(states) if state.strip()), states[-1])


def readable(text: str) -> str:
    """``text`` as its terminal would have shown it, escapes gone and controls made visible;
    each of its lines on its own (a traceback keeps its lines)."""
    if text.isprintable():  # the common case: nothing to do
        return text
    lines = []
    for line in text.split("\n"):
        line = _ESCAPE.sub("", _LINE_RESET.sub("\r", line))
        lines.append(_CONTROL.sub(_escaped, _final_state(line)))
    return "\n".join(lines)
