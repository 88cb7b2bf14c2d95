"""The one exception type for problems a user can fix (bad flag, bad file, bad input).

The command line prints a ``BertkitError`` as one line and exits 2; anything else is a bug in bertkit
and keeps its full traceback (exit 1). Both classes subclass the built-in they refine, so callers that
catch ``ValueError`` or ``FileNotFoundError`` keep working.
"""

from __future__ import annotations


class BertkitError(ValueError):
    """A user-caused error whose message names the value, the limit and the fix."""


class MissingFileError(BertkitError, FileNotFoundError):
    """A file or directory the user named (or that a command needs) does not exist."""


class NonFiniteError(BertkitError):
    """A loss, gradient or model output that is NaN or infinite: never turned into a score or saved weights."""
