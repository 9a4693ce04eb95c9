"""translate.py's two kinds of error, each ending in one line (`nmt.runtime.cli`)."""

from nmt.runtime import cli


class UsageError(cli.UsageError):
    """Invalid flags or flag combination (exit status 2)."""


class InputError(cli.Fault):
    """Unreadable input, model or data (exit status 1); the message names what and where."""
