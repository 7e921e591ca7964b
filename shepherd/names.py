"""The names a job spec and the worker registries share: loops', programs' and the keys of
a program's arguments. A leaf module: :mod:`shepherd.spec` checks a spec by them, and
:mod:`shepherd.programs` (which spec consults) checks registrations by them, without either
importing the other for it.
"""

from __future__ import annotations

import re

# `\Z`, not `$`: `$` also matches before a trailing newline ("name\n" would pass).
#: A registered training loop's name (shepherd.loops checks worker registrations by it too).
LOOP_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,62}\Z")
#: Programs are named as loops are.
PROGRAM_NAME = LOOP_NAME
#: A program argument's key: a name, or a dotted path of names (the cookbook's chz configs
#: take ``key=value`` and ``a.b=value``).
PROGRAM_ARG_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}(\.[A-Za-z_][A-Za-z0-9_]{0,63}){0,7}\Z")
