"""The benches' figures as rows: every run appends to bench/results/BENCH.csv.

One row a figure: the run's UTC date and time, the commit it ran (``git rev-parse HEAD``, or
``unknown`` outside a checkout), the figure's name as the bench prints it, and its value. One
row a figure rather than a column a figure, so that a run with more or fewer figures (options,
a peer not installed) appends to the same file.
"""

from __future__ import annotations

import csv
import subprocess
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
COLUMNS = ("date", "commit", "figure", "value")


def commit() -> str:
    """The checked-out commit, or ``unknown`` (no git, or not a checkout)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=RESULTS.parent,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def record(bench: str, figures: Mapping[str, float], folder: Path = RESULTS) -> Path:
    """Append ``figures`` to ``folder/BENCH.csv`` (written with its header when new), and say
    where on stderr (stdout may be a bench's JSON)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{bench}.csv"
    date = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    head = commit()
    new = not path.exists()
    with path.open("a", newline="", encoding="utf-8") as out:
        writer = csv.writer(out, lineterminator="\n")
        if new:
            writer.writerow(COLUMNS)
        for name, value in figures.items():
            writer.writerow((date, head, name, round(float(value), 4)))
    print(f"{len(figures)} figures appended to {path}", file=sys.stderr)
    return path
