"""What a machine's backend printed, read by the controller when a boot times out.

A machine whose backend never became ready is failed by the tick once its boot timeout has
run out (its agent may still be waiting, or never joined): the reason names the cause with
the backend's last lines where its provisioner can read them (``ShowsOutput``: a local
machine's log file, a Docker machine's container log). The agent's own structured lines are
left out; what is left is bounded and redacted by the agent's own rules, so a boot failure
reads the same whoever reports it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from agent.tail import TAIL_LINES

AGENT_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d agent machine=")


@runtime_checkable
class ShowsOutput(Protocol):
    def last_output(self, name: str, provider_id: str | None) -> list[str]:
        """The last lines the machine printed (its agent's and its backend's), oldest first;
        empty when there is nothing to read."""
        ...


def backend_lines(lines: Sequence[str]) -> list[str]:
    """A machine's output less its agent's own lines: what the backend printed."""
    return [line for line in lines if line.strip() and not AGENT_LINE.match(line)]


def tail_of_file(path: str, lines: int = TAIL_LINES * 4, limit: int = 64 * 1024) -> list[str]:
    """The last lines of a file (reading at most its last ``limit`` bytes); [] if unreadable."""
    try:
        with open(path, "rb") as file:
            file.seek(0, 2)
            size = file.tell()
            file.seek(max(0, size - limit))
            data = file.read()
    except OSError:
        return []
    return data.decode(errors="replace").splitlines()[-lines:]
