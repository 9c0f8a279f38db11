"""User-facing errors: one line that names the file or key and says what to do."""


class MinBertError(Exception):
    """An error caused by the user's input (files, params, names), not by a bug.

    Stage CLIs print its message on one line and exit with status 2; no traceback.
    """
