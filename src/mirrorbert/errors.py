"""One exception type for mistakes a user can fix; the CLI prints it as a single line."""


class UserError(Exception):
    """Bad input, missing file, unknown option: reported without a traceback, exit code 2."""


class DatasetMissing(UserError):
    """An evaluation set is absent from the data directory; the task is reported as skipped."""
