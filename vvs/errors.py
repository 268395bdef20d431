"""The one exception type users see: the CLI prints ``str(err)`` as one line and exits with code 2."""
import json


class VVSError(Exception):
    """Bad input (a file, an option, a folder): the message says what is wrong and what to do."""


def json_value(value) -> str:
    """A value in a message as a JSON client sent it (true, null, [1, 2]), not as Python writes it (True, None);
    strings and numbers as Python writes them ('wolf', nan)."""
    text = None
    if value is None or isinstance(value, (bool, list, tuple, dict)):
        try:
            text = json.dumps(value)
        except (TypeError, ValueError):
            pass
    text = repr(value) if text is None else text
    return text if len(text) <= 60 else text[:59] + "…"
