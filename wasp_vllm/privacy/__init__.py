"""Differential privacy: accounting, the voting mechanisms, secrets, and which records take part."""

from __future__ import annotations

import logging

#: Prefix of every log line that holds a statistic of the private data.  Such lines are DEBUG only:
#: the default log level is what people paste into tickets, DEBUG output is the operator's.
PRIVATE_MARK = "[private: DEBUG logs are the operator's, never share] "


def debug_private(logger: logging.Logger, message: str, *args: object) -> None:
    """Log a line that depends on the private data: DEBUG level only, marked as private."""
    logger.debug(PRIVATE_MARK + message, *args)
