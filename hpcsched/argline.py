"""Strict reading of a plain command line, for the start-up fast paths of ``hpcsched simulate``.

Why: building the Typer app (and the pydantic it loads) costs more than a whole small simulation, so the
common lines are run without it; anything this does not fully understand goes to Typer, which then gives its
own help and messages. So it reads only the options it is given (``--opt value`` or ``--opt=value``, each at
most once) and ``--json``, and answers None at the first other word.
"""

from __future__ import annotations

from collections.abc import Mapping


def read_plain_line(args: list[str], options: Mapping[str, str]) -> tuple[dict[str, str], bool] | None:
    """(option key -> value, whether ``--json`` was given) for a line of only ``options`` (flag -> key) and
    ``--json``; None for anything else (an unknown word, a repeated option, an option without its value)."""
    opts: dict[str, str] = {}
    as_json = False
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--json" and not as_json:
            as_json, i = True, i + 1
            continue
        name, eq, value = word.partition("=")
        key = options.get(name)
        if key is None or key in opts:
            return None
        if not eq:
            if i + 1 >= len(args) or args[i + 1].startswith("--"):
                return None
            value, i = args[i + 1], i + 1
        opts[key] = value
        i += 1
    return opts, as_json
