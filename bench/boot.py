"""Boot benchmark: a machine's create-to-ready time, phase by phase, over rounds of `rehearse`.

    .venv/bin/python bench/boot.py [--rounds 3] [--jobs 2] [--paths default,fallback,baked] [--json]

Each round rehearses the example pool (`sp00ky-infra rehearse`: the real controller, Pulumi
engine and user-data against the fake Hetzner cloud, each server a container that boots it)
once per image path (`--paths`, as `rehearse --paths` takes them: default docker-ce, fallback
debian-12 with Docker installed at boot, baked the pool's snapshot, baked first; without it,
the pool's own image) and reads its report: every machine that became ready, its phases
(pulumi up, create, cloud-init, agent install, image, healthcheck) and its create-to-ready.
Printed per path: each phase's median (max) over every machine of every round, the
create-to-ready, the rehearsal's Hetzner estimate, the downloads, and the bake's time (outside
every create-to-ready). Needs a Docker engine, the rehearsal image (and its variant without
Docker for the fallback) and the pulumi CLI, like `rehearse` itself; a round of the three
paths takes five minutes or so. The load average before and after is printed beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from record import record

from sp00ky_infra.rehearse.phases import DOWNLOADS, TOTAL, parse_paths, side_by_side
from tests.pulumi_engine import example_config

OWN = "own"  # the pool's own image: a rehearsal without --paths


def rehearse(config: Path, jobs: int, workdir: Path, paths: str | None) -> dict[str, Any]:
    """One round's reports by path (its JSON); a failed rehearsal is reported, not hidden."""
    chosen = ["--paths", paths] if paths else []
    done = subprocess.run(
        [sys.executable, "-m", "sp00ky_infra", "rehearse", str(config), "--jobs", str(jobs),
         "--workdir", str(workdir), "--json", *chosen],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    try:
        found: dict[str, Any] = json.loads(done.stdout)
    except json.JSONDecodeError:
        message = f"rehearse printed no report (exit {done.returncode}):\n{done.stderr}"
        raise SystemExit(message) from None
    reports: dict[str, Any] = found["paths"] if paths else {OWN: found}
    for path, report in reports.items():
        if not report.get("ok"):
            print(f"  {path}: the rehearsal failed: {report.get('failed')}", file=sys.stderr)
    return reports


def machines(report: dict[str, Any]) -> list[dict[str, float | None]]:
    """Each ready machine's phases and its create-to-ready."""
    return [
        {**m["phases"], TOTAL: m["created_to_ready"]}
        for m in report.get("machines", [])
        if m.get("outcome") == "ready"
    ]


def _cell(spread: tuple[float, float] | None) -> str:
    return "-" if spread is None else f"{spread[0]:.1f}s ({spread[1]:.1f})"


def show(results: dict[str, dict[str, Any]]) -> None:
    """Per path a column: each phase's median (max), the estimate, the downloads, the bake."""
    paths = list(results)
    print(f"  {'median (max)':<16}" + "".join(f"{p:>18}" for p in paths))
    table = side_by_side({p: found["machines"] for p, found in results.items()})
    for row, spreads in table.items():
        print(f"  {row:<16}" + "".join(f"{_cell(spreads[p]):>18}" for p in paths))
    rows = {
        "machines ready": [str(len(results[p]["machines"])) for p in paths],
        "Hetzner est.": [_seconds(results[p]["estimate"].get("total")) for p in paths],
        **{kind: [str(results[p]["downloads"][kind]) for p in paths] for kind in DOWNLOADS},
        "bake": [_cell(_spread(results[p]["bakes"])) for p in paths],
    }
    for name, cells in rows.items():
        print(f"  {name:<16}" + "".join(f"{c:>18}" for c in cells))


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def _spread(values: Sequence[float]) -> tuple[float, float] | None:
    return (statistics.median(values), max(values)) if values else None


def run(rounds: int, jobs: int, paths: tuple[str, ...] | None) -> dict[str, dict[str, Any]]:
    """Every round of every path: its ready machines, last estimate, downloads and bakes."""
    names = paths or (OWN,)
    chosen = ",".join(paths) if paths else None
    results: dict[str, dict[str, Any]] = {
        p: {"machines": [], "estimate": {}, "downloads": dict.fromkeys(DOWNLOADS, 0), "bakes": []}
        for p in names
    }
    with tempfile.TemporaryDirectory() as scratch:
        config = example_config(Path(scratch))
        for n in range(rounds):
            print(f"round {n + 1} of {rounds}: {', '.join(names)} ...", file=sys.stderr)
            for path, report in rehearse(config, jobs, Path(scratch) / f"work-{n}", chosen).items():
                found = results[path]
                found["machines"] += machines(report)
                found["estimate"] = report.get("estimate") or found["estimate"]
                for kind in DOWNLOADS:
                    found["downloads"][kind] += report.get("downloads", {}).get(kind, 0)
                if report.get("bake_seconds") is not None:
                    found["bakes"].append(report["bake_seconds"])
    return results


def figures(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """What is recorded: per path each row's median, the estimate's total, the bake's median."""
    out: dict[str, float] = {}
    table = side_by_side({p: found["machines"] for p, found in results.items()})
    for row, spreads in table.items():
        for path, spread in spreads.items():
            if spread is not None:
                out[f"{path}_{row}_median_s".replace(" ", "_")] = spread[0]
    for path, found in results.items():
        if found["estimate"].get("total") is not None:
            out[f"{path}_hetzner_estimate_s"] = found["estimate"]["total"]
        if found["bakes"]:
            out[f"{path}_bake_median_s"] = statistics.median(found["bakes"])
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2, help="jobs queued a round")
    parser.add_argument("--paths", default=None, help="image paths: all, or some of "
                        "default,fallback,baked (default: the pool's own image)")  # fmt: skip
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        paths = parse_paths(args.paths) if args.paths else None
    except ValueError as exc:
        parser.error(str(exc))
    before = os.getloadavg()[0]
    results = run(args.rounds, args.jobs, paths)
    load = f"load average {before:.1f} before, {os.getloadavg()[0]:.1f} after"
    if args.json:
        print(json.dumps({"paths": results, "load": load}, indent=2))
    else:
        show(results)
        print(f"  ({load}: a busy host slows every phase)")
    record("boot", figures(results))


if __name__ == "__main__":
    main()
