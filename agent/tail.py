"""A backend's tail: what a failed boot shows of its output. Its last lines, bounded so that
a noisy backend never makes a huge report, and redacted so that no secret leaves the machine.

Pure (the standard library's ``re`` only): the controller redacts what a machine's backend
printed with these same rules when a boot times out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

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


def _token_like(word: str) -> bool:
    """Long and made of upper case, lower case and digits: a key or token, not a word."""
    return (
        any(c.isdigit() for c in word)
        and any(c.islower() for c in word)
        and any(c.isupper() for c in word)
    )


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every value of ``secrets`` (the backend's env: any may be one) and every
    token-like string (key=value of a secret-sounding name, bearer tokens, passwords in URLs,
    long hex and long mixed-case strings) replaced by ***."""
    for value in sorted({v for v in secrets if len(v) >= 4}, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    text = _BEARER.sub(rf"\1\2{REDACTED}", text)
    text = _SECRET_ASSIGNMENTS.sub(rf"\1\2{REDACTED}", text)
    text = _URL_PASSWORD.sub(rf"\1{REDACTED}@", text)
    text = _HEX.sub(REDACTED, text)
    return _MIXED.sub(lambda m: REDACTED if _token_like(m.group()) else m.group(), text)


def output_summary(lines: Sequence[str], secrets: Iterable[str] = ()) -> str:
    """The last lines of output as one bounded, redacted line for a failed boot's reason."""
    kept = [redact(line.rstrip(), secrets)[:TAIL_LINE_CHARS] for line in lines if line.strip()]
    kept = kept[-TAIL_LINES:]
    if not kept:
        return "it wrote no output"
    text = " | ".join(kept)
    if len(text) > TAIL_CHARS:
        text = "..." + text[-TAIL_CHARS:]
    return f"its last output: {text}"
