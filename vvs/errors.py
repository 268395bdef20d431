"""The one exception type users see: the CLI prints ``str(err)`` as one line and exits with code 2."""


class VVSError(Exception):
    """Bad input (a file, an option, a folder): the message says what is wrong and what to do."""
