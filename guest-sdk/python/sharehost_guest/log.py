"""Logging to the host's log, tagged with the plugin's name.

In a component each call is one line through the host's ``log`` import (bounded per batch by
the host: messages over 4 KiB are truncated, past 256 lines per batch they are dropped and
counted). Natively (your unit tests) lines go to :mod:`sharehost_guest.testing`'s collector
(``testing.take_logs()``) and to stderr, so pytest shows them for a failing test.
"""

from __future__ import annotations

#: The levels, lowest first (the contract's ``level`` enum).
LEVELS = ("trace", "debug", "info", "warn", "error")


def log(level: str, message: str) -> None:
    """Logs ``message`` at ``level`` (one of :data:`LEVELS`)."""
    if level not in LEVELS:
        raise ValueError(f"unknown log level {level!r}; use one of {', '.join(LEVELS)}")
    from . import _backend

    _backend.log(level, str(message))


def trace(message: str) -> None:
    """Logs at trace level (very detailed tracing)."""
    log("trace", message)


def debug(message: str) -> None:
    """Logs at debug level (debugging detail)."""
    log("debug", message)


def info(message: str) -> None:
    """Logs at info level (normal operation)."""
    log("info", message)


def warn(message: str) -> None:
    """Logs at warn level (something unusual the operator may want to know)."""
    log("warn", message)


#: Alias of :func:`warn`, the name Python's ``logging`` uses.
warning = warn


def error(message: str) -> None:
    """Logs at error level (something failed)."""
    log("error", message)
