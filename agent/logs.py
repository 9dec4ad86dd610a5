"""The agent's log: one line on stdout an event, ``agent machine=NAME event=EVENT key=value``."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Protocol

# Reentrant: the signal handler logs, in the main thread, which may be inside log() then.
_LOG_LOCK = threading.RLock()


class Log(Protocol):
    """One machine's log: ``log(event, key=value, ...)``."""

    def __call__(self, event: str, **fields: Any) -> None: ...


def log(machine: str, event: str, **fields: Any) -> None:
    """One line on stdout, written whole: the line and its newline in one write, one thread
    at a time. The agent runs unbuffered (PYTHONUNBUFFERED, as its unit, image and local
    machines start it), where ``print`` writes the text and the newline apart, and lines
    of two threads (the poll loop, the courier, the watchdog) ran together."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    extra = " ".join(f"{key}={value}" for key, value in fields.items() if value is not None)
    line = f"{stamp} agent machine={machine} event={event} {extra}".rstrip() + "\n"
    with _LOG_LOCK:
        sys.stdout.write(line)
        sys.stdout.flush()
