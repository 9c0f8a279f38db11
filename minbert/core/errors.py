"""User-facing errors: one line that names the file or key and says what to do, with the nearest
valid name for a typo (`close`)."""
from __future__ import annotations

import difflib

MAX_MESSAGE = 2000        # characters: a message quoting a long value keeps its head and its advice


def one_line(text: str, limit: int = MAX_MESSAGE) -> str:
    """`text` as one bounded line: line breaks shown as \\n (a value quoted from a file may hold
    them), and a message longer than `limit` cut in its middle, where a quoted value sits, keeping
    the start (the file and key) and the end (what to do)."""
    text = text.replace("\r", "\\r").replace("\n", "\\n")
    if len(text) <= limit:
        return text
    head, tail = limit * 2 // 3, limit // 4
    return f"{text[:head]} ... ({len(text) - head - tail:,} characters left out) ... {text[-tail:]}"


class MinBertError(Exception):
    """An error caused by the user's input (files, params, names), not by a bug.

    Stage CLIs print its message on one line and exit with status 2; no traceback. The message is
    one line of at most about MAX_MESSAGE characters, whatever it quotes (`one_line`).
    """

    def __init__(self, message: object = "", *args):
        super().__init__(one_line(str(message)), *args)


def close(word, choices) -> str:
    """' (did you mean ...?)' with the nearest of `choices`, or '' when none is near."""
    m = difflib.get_close_matches(str(word), list(choices), n=1)
    return f" (did you mean '{m[0]}'?)" if m else ""
