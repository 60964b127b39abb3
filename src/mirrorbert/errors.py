"""One exception type for mistakes a user can fix; the CLI prints it as a single line."""


class UserError(ValueError):
    """Bad input, missing file, unknown option: reported without a traceback, exit code 2.

    A ValueError, so Python callers catch a bad argument the way they catch any other.
    """


class DatasetMissing(UserError):
    """An evaluation set is absent from the data directory; the task is reported as skipped."""


class NonFiniteEmbeddings(UserError):
    """A model produced NaN or infinite vectors: every score computed from them would be meaningless, so
    commands stop (exit 2) instead of printing NaN as a result."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name when empty), for one-line error reports."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
