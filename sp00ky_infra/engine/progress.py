"""Builds and pulls tell their progress, the engine's own JSON events as they stream (build
steps, pulled layers), to the reporter a caller installs with ``reporting`` (the CLI draws it
on a terminal); with none installed they say nothing."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any

# What is under way ("building sp00ky-dev-pool-renderer", "pulling REF"), and one event of the
# engine's stream: {"stream": "Step 2/5 : COPY ..."} for a build, {"status": "Downloading",
# "id": LAYER, "progressDetail": {...}} for a pull.
Reporter = Callable[[str, Mapping[str, Any]], None]
_reporter: ContextVar[Reporter | None] = ContextVar("sp00ky_engine_reporter", default=None)


@contextlib.contextmanager
def reporting(reporter: Reporter | None) -> Iterator[None]:
    """Builds and pulls in this context (this thread) tell ``reporter`` their progress."""
    token = _reporter.set(reporter)
    try:
        yield
    finally:
        _reporter.reset(token)


def report(what: str, event: Mapping[str, Any]) -> None:
    """Tell the reporter of this context, if any, one event of what is under way."""
    reporter = _reporter.get()
    if reporter is not None:
        reporter(what, event)
