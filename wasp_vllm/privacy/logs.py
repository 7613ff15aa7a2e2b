"""Log lines that depend on the private data: DEBUG only, and marked as the operator's.

The default log level is what people paste into tickets, so nothing there may depend on the
private records; DEBUG output (``-v``) is the operator's own, and every line of it that holds a
statistic of the private data says so.
"""

from __future__ import annotations

import logging

PRIVATE_MARK = "[private: DEBUG logs are the operator's, never share] "


def debug_private(logger: logging.Logger, message: str, *args: object) -> None:
    """Log a line that depends on the private data: DEBUG level only, marked as private."""
    logger.debug(PRIVATE_MARK + message, *args)
