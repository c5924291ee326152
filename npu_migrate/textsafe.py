"""Text from peers is data: what another process wrote is made safe to print before it is shown.

Usage::

    from npu_migrate.textsafe import printable

    logger.error("node 1 says: %s", printable(reason))      # no escapes, bounded length
    printable(traceback_text, limit=4000, keep_newlines=True)

Anything read from a store, a rank's record, a probe file or a report that another machine (or
another user) could have written goes through :func:`printable` before it reaches a console or a
report: control characters (ANSI escape sequences included) are dropped, and the text is cut to a
bound, so a peer can neither repaint a terminal nor flood it.
"""

from __future__ import annotations

import re

DEFAULT_LIMIT = 2000
"""Characters kept by default: a long error message, not a log file."""

# A whole CSI/OSC escape sequence first (so its parameters do not survive as text), then any
# other C0/C1 control character except tab and newline.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]?")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: object, limit: int = DEFAULT_LIMIT, keep_newlines: bool = False) -> str:
    """``text`` with control characters removed and its length bounded.

    Args:
        text: what a peer wrote (anything; it is turned into ``str`` first).
        limit: the most characters returned; longer text ends with ``... [N more characters]``.
        keep_newlines: keep line breaks (for tracebacks); otherwise they become spaces, so the
            result is one line.
    """
    value = str(text)
    value = _ESCAPES.sub("", value)
    if not keep_newlines:
        value = value.replace("\r\n", " ").replace("\n", " ").replace("\r", " ")
    value = _CONTROL.sub("", value.replace("\r", "")) if keep_newlines else _CONTROL.sub("", value)
    if len(value) > limit:
        value = f"{value[:limit]}... [{len(value) - limit} more characters]"
    return value
