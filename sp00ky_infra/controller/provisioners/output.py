"""What a machine's backend printed, read by the controller when a boot times out.

A machine whose backend never became ready is failed by the tick once its boot timeout has
run out (its agent may still be waiting, or never joined): the reason names the cause with
the backend's last lines where its provisioner can read them (``ShowsOutput``: a local
machine's log file, a Docker machine's container log). The agent's own structured lines are
left out; what is left is bounded and redacted exactly as the agent redacts a boot failure it
reports itself (``agent/runtime.py``: the agent imports nothing of this package, so the rules
are written twice, and tests/controller/test_boot_reasons.py holds the two in agreement).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

TAIL_LINES = 12
TAIL_LINE_CHARS = 240
TAIL_CHARS = 1500
REDACTED = "***"
_SECRET_NAME = (
    r"[A-Za-z0-9_.-]*(?:secret|token|passw(?:or)?d|api[_-]?key|credential|auth)[A-Za-z0-9_.-]*"
)
_SECRET_ASSIGNMENTS = re.compile(rf"(?i)\b({_SECRET_NAME})(\s*[=:]\s*)(\"[^\"]*\"|'[^']*'|\S+)")
_BEARER = re.compile(r"(?i)\b(bearer|basic|token)(\s+)[A-Za-z0-9._~+/=-]{8,}")
_URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^/\s:@]+:)[^@\s/]+@", re.IGNORECASE)
_HEX = re.compile(r"\b[0-9a-fA-F]{32,}\b")
_MIXED = re.compile(r"[A-Za-z0-9_+/=-]{32,}")
AGENT_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d agent machine=")


@runtime_checkable
class ShowsOutput(Protocol):
    def last_output(self, name: str, provider_id: str | None) -> list[str]:
        """The last lines the machine printed (its agent's and its backend's), oldest first;
        empty when there is nothing to read."""
        ...


def _token_like(word: str) -> bool:
    return (
        any(c.isdigit() for c in word)
        and any(c.islower() for c in word)
        and any(c.isupper() for c in word)
    )


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every value of ``secrets`` and every token-like string replaced by ***."""
    for value in sorted({v for v in secrets if len(v) >= 4}, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    text = _BEARER.sub(rf"\1\2{REDACTED}", text)
    text = _SECRET_ASSIGNMENTS.sub(rf"\1\2{REDACTED}", text)
    text = _URL_PASSWORD.sub(rf"\1{REDACTED}@", text)
    text = _HEX.sub(REDACTED, text)
    return _MIXED.sub(lambda m: REDACTED if _token_like(m.group()) else m.group(), text)


def backend_lines(lines: Sequence[str]) -> list[str]:
    """A machine's output less its agent's own lines: what the backend printed."""
    return [line for line in lines if line.strip() and not AGENT_LINE.match(line)]


def output_summary(lines: Sequence[str], secrets: Iterable[str] = ()) -> str:
    """The last lines as one bounded, redacted line for a failed boot's reason."""
    kept = [redact(line.rstrip(), secrets)[:TAIL_LINE_CHARS] for line in lines if line.strip()]
    kept = kept[-TAIL_LINES:]
    if not kept:
        return "it wrote no output"
    text = " | ".join(kept)
    if len(text) > TAIL_CHARS:
        text = "..." + text[-TAIL_CHARS:]
    return f"its last output: {text}"


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
