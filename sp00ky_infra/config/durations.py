"""Durations in the docs' form: ``90s``, ``10m``, ``1h30m``, ``8h``, ``14d``.

Units, largest first, each at most once: ``d`` (days), ``h``, ``m``, ``s``, ``ms``.
Pure: no I/O.
"""

from __future__ import annotations

import re

# Keep in step with "$defs.duration.pattern" in sp00ky.schema.json (a test checks they agree).
PATTERN = r"^(?=\d)(\d+d)?(\d+h)?(\d+m(?!s))?(\d+s)?(\d+ms)?$"
_RE = re.compile(PATTERN)
_UNIT_SECONDS = (86400.0, 3600.0, 60.0, 1.0, 0.001)
EXAMPLES = "90s, 10m, 1h30m or 8h"


class DurationError(ValueError):
    """A string that is not a duration; the message says how to write one."""


def parse_duration(text: str) -> float:
    """Return the duration in seconds, or raise DurationError naming the bad text."""
    if not isinstance(text, str):
        raise DurationError(f"{text!r} is not a duration; write it as a string like {EXAMPLES}")
    match = _RE.match(text.strip())
    if match is None:
        hint = f"; add a unit: {text.strip()}s" if text.strip().isdigit() else ""
        raise DurationError(f"{text!r} is not a duration; write it like {EXAMPLES}{hint}")
    total = 0.0
    for group, unit in zip(match.groups(), _UNIT_SECONDS, strict=True):
        if group:
            total += int(group.rstrip("dhms")) * unit
    return total


def format_duration(seconds: float) -> str:
    """The shortest docs-style text for a whole number of seconds (``5400`` -> ``1h30m``)."""
    if seconds <= 0:
        return "0s"
    whole = int(seconds)
    millis = round((seconds - whole) * 1000)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, whole = divmod(whole, size)
        if count:
            parts.append(f"{count}{unit}")
    if millis:
        parts.append(f"{millis}ms")
    return "".join(parts)
