"""Workloads: the jobs that arrive. A trace file (CSV or JSONL), a synthetic one (Poisson
arrivals, a duration distribution, bursts), or the store's own history (``jobs export``
writes it in the trace format).

A trace has one job per line (row); ``TRACE_COLUMNS`` says what each column holds and in
which unit (``simulate --help`` prints it). Absolute times (unix seconds, or ISO 8601 with its
offset) start the trace at the first one.
"""

from __future__ import annotations

import csv
import io
import json
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from sp00ky_infra.config.durations import DurationError, parse_duration

FIELDS = ("at", "duration", "backend", "priority", "slots", "delay")
UNIX_TIME = 1e9  # a first `at` past this is a unix time (2001-09-09): the trace is shifted
TRACE_COLUMNS = (
    ("at", "when the job arrived: seconds from the trace's start (0, 12.5), a unix time in "
     "seconds (1767225600), or an ISO 8601 time with its offset (2026-01-01T09:00:00Z, "
     "2026-01-01T10:00:00+01:00); absolute times start the trace at the first one"),
    ("duration", "how long the backend works on the job: seconds (90) or a duration (90s, 2m)"),
    ("backend", "optional: the backend the job is for; with several pools each one gets its "
     "backend's jobs"),
    ("priority", "optional whole number, default 0: a higher one starts first"),
    ("slots", "optional whole number, default 1: the slots of a machine the job takes"),
    ("delay", "optional, default 0: seconds or a duration before it may start (run --delay)"),
)  # fmt: skip


class WorkloadError(ValueError):
    """A trace or a synthetic workload that cannot be read; the message names line and field."""


@dataclass(frozen=True, slots=True)
class Arrival:
    at: float
    duration: float
    backend: str | None = None
    priority: int = 0
    slots: int = 1
    delay: float = 0.0


# --- distributions ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Distribution:
    """Seconds drawn from ``kind``: fixed:A, uniform:A..B, normal:MEAN,SD (never below 0),
    exp:MEAN, lognormal:MEDIAN,SIGMA. Values are seconds or durations (90s, 2m)."""

    kind: str
    a: float
    b: float = 0.0

    def sample(self, rng: random.Random) -> float:
        if self.kind == "fixed":
            return self.a
        if self.kind == "uniform":
            return rng.uniform(self.a, self.b)
        if self.kind == "normal":
            return max(0.0, rng.gauss(self.a, self.b))
        if self.kind == "exp":
            return rng.expovariate(1.0 / self.a) if self.a > 0 else 0.0
        return self.a * math.exp(rng.gauss(0.0, self.b))  # lognormal

    @property
    def mean(self) -> float:
        if self.kind == "uniform":
            return (self.a + self.b) / 2
        if self.kind == "lognormal":
            return self.a * math.exp(self.b**2 / 2)
        return self.a

    def __str__(self) -> str:
        if self.kind in ("fixed", "exp"):
            return f"{self.kind}:{self.a:g}s"
        sep = ".." if self.kind == "uniform" else ","
        unit = "" if self.kind == "lognormal" else "s"
        return f"{self.kind}:{self.a:g}s{sep}{self.b:g}{unit}"

    @classmethod
    def parse(cls, text: str) -> Distribution:
        kind, _, rest = text.partition(":")
        if not rest:  # a bare number or duration: fixed
            return cls("fixed", seconds(text, "distribution"))
        try:
            if kind == "fixed" or kind == "exp":
                return cls(kind, seconds(rest, kind))
            if kind == "uniform":
                low, _, high = rest.partition("..")
                return cls(kind, seconds(low, kind), seconds(high, kind))
            if kind == "normal":
                mean, _, sd = rest.partition(",")
                return cls(kind, seconds(mean, kind), seconds(sd, kind))
            if kind == "lognormal":
                median, _, sigma = rest.partition(",")
                return cls(kind, seconds(median, kind), float(sigma))
        except (ValueError, WorkloadError) as exc:
            raise WorkloadError(f"distribution {text!r}: {exc}") from None
        raise WorkloadError(
            f"distribution {text!r}: use fixed:90s, uniform:30s..2m, normal:60s,15s, exp:45s "
            "or lognormal:60s,0.5"
        )


def seconds(text: Any, what: str) -> float:
    """A number of seconds, or a duration in the docs' form."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        value = float(text)
    else:
        raw = str(text).strip()
        try:
            value = float(raw)
        except ValueError:
            try:
                value = parse_duration(raw)
            except DurationError as exc:
                raise WorkloadError(f"{what}: {exc}") from None
    if not math.isfinite(value) or value < 0:
        raise WorkloadError(f"{what}: {text!r} must be 0 or more seconds")
    return value


# --- synthetic --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Burst:
    at: float
    count: int

    @classmethod
    def parse(cls, text: str) -> Burst:
        at, _, count = text.partition(":")
        try:
            return cls(seconds(at, "burst"), int(count))
        except ValueError:
            raise WorkloadError(f"burst {text!r}: write AT:COUNT, e.g. 9h:50") from None


def synthetic(
    rate_per_hour: float,
    duration: Distribution,
    hours: float = 24.0,
    bursts: Sequence[Burst] = (),
    seed: int = 0,
) -> list[Arrival]:
    """Poisson arrivals at ``rate_per_hour`` for ``hours``, plus ``bursts`` (COUNT jobs at
    once at AT), each job's duration drawn from ``duration``."""
    rng = random.Random(seed)
    end = hours * 3600.0
    times: list[float] = []
    if rate_per_hour > 0:
        t = rng.expovariate(rate_per_hour / 3600.0)
        while t < end:
            times.append(t)
            t += rng.expovariate(rate_per_hour / 3600.0)
    for burst in bursts:
        times.extend([burst.at] * burst.count)
    times.sort()
    return [Arrival(at, duration.sample(rng)) for at in times]


# --- files ------------------------------------------------------------------------------------


def read_trace(path: str | Path, backend: str | None = None) -> list[Arrival]:
    """A trace from a .csv or .jsonl file (``-`` is not supported: a trace is a file)."""
    text = Path(path).read_text()
    rows = _jsonl(text) if str(path).endswith((".jsonl", ".json")) else _csv(text)
    arrivals = [_arrival(row, line) for line, row in rows]
    if backend is not None:
        arrivals = [a for a in arrivals if a.backend in (None, backend)]
    arrivals.sort(key=lambda a: a.at)
    if arrivals and arrivals[0].at >= UNIX_TIME:
        start = arrivals[0].at
        arrivals = [
            Arrival(a.at - start, a.duration, a.backend, a.priority, a.slots, a.delay)
            for a in arrivals
        ]
    return arrivals


def _jsonl(text: str) -> Iterable[tuple[int, Mapping[str, Any]]]:
    for line, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except ValueError as exc:
            raise WorkloadError(f"line {line}: not JSON ({exc})") from None
        if not isinstance(row, dict):
            raise WorkloadError(f"line {line}: expected an object with at and duration")
        yield line, row


def _csv(text: str) -> Iterable[tuple[int, Mapping[str, Any]]]:
    reader = csv.DictReader(io.StringIO(text))
    if reader.fieldnames is None or not {"at", "duration"} <= set(reader.fieldnames):
        raise WorkloadError("line 1: a CSV trace needs a header with at and duration")
    for row in reader:
        yield reader.line_num, {k: v for k, v in row.items() if v not in (None, "")}


def _arrival(row: Mapping[str, Any], line: int) -> Arrival:
    try:
        if "at" not in row or "duration" not in row:
            raise WorkloadError("at and duration are required")
        slots = int(row.get("slots", 1))
        if slots < 1:
            raise WorkloadError(f"slots: a job takes at least 1 slot, not {slots}")
        return Arrival(
            at=_instant(row["at"]),
            duration=seconds(row["duration"], "duration"),
            backend=str(row["backend"]) if row.get("backend") is not None else None,
            priority=int(row.get("priority", 0)),
            slots=slots,
            delay=seconds(row.get("delay", 0), "delay"),
        )
    except (WorkloadError, ValueError) as exc:
        raise WorkloadError(f"line {line}: {exc}") from None


def _instant(value: Any) -> float:
    """A trace's ``at``: seconds (from the trace's start, or unix), or an ISO 8601 time with
    its offset, as unix seconds."""
    if not isinstance(value, str) or "T" not in value.upper():
        return seconds(value, "at")
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise WorkloadError(
            f"at: {value!r} is not an ISO 8601 time; write 2026-01-01T09:00:00Z, "
            "2026-01-01T10:00:00+01:00 or seconds"
        ) from None
    if moment.tzinfo is None:
        raise WorkloadError(
            f"at: {value!r} has no offset, so the instant it names is not known; add one "
            f"(Z for UTC, or +01:00), e.g. {value}Z"
        )
    return moment.timestamp()


def write_trace(arrivals: Iterable[Arrival], out: TextIO, fmt: str = "csv") -> int:
    """Write ``arrivals`` as CSV (with a header) or JSONL; returns how many."""
    count = 0
    if fmt == "csv":
        writer = csv.writer(out)
        writer.writerow(FIELDS)
    for a in arrivals:
        row = {
            "at": round(a.at, 3),
            "duration": round(a.duration, 3),
            "backend": a.backend,
            "priority": a.priority,
            "slots": a.slots,
            "delay": round(a.delay, 3),
        }
        if fmt == "csv":
            writer.writerow(["" if row[k] is None else row[k] for k in FIELDS])
        else:
            out.write(json.dumps({k: v for k, v in row.items() if v is not None}) + "\n")
        count += 1
    return count
