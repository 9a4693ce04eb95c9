"""What translate.py and the server raise for input they cannot read, beside the usage errors
of every command (`nmt.runtime.cli.UsageError`); each ends in one line."""

from nmt.runtime import cli


class InputError(cli.Fault):
    """Unreadable input, model or data (exit status 1); the message names what and where."""
