"""Boot benchmark: a machine's create-to-ready time, phase by phase, over rounds of `rehearse`.

    .venv/bin/python bench/boot.py [--rounds 3] [--jobs 2] [--image NAME ...] [--json]

Each round rehearses the example pool (`sp00ky-infra rehearse`: the real controller, Pulumi
engine and user-data against the fake Hetzner cloud, each server a container that boots it)
and reads its report: every machine that became ready, its phases (pulumi up, create,
cloud-init, agent install, image, healthcheck) and its create-to-ready total. Printed: each
phase's median and maximum over every machine of every round, per image path (`--image`
sets the pool's `machine.image`; without it, the pool's own), and the rehearsal's Hetzner
estimate for that path. Needs a Docker engine, the rehearsal image and the pulumi CLI, like
`rehearse` itself; a round takes a minute or two.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from record import record

from sp00ky_infra.rehearse.phases import PHASES
from tests.pulumi_engine import example_config

TOTAL = "create-to-ready"


def rehearse(config: Path, jobs: int, workdir: Path) -> dict[str, Any]:
    """One rehearsal's report (its JSON); a failed rehearsal is reported, not hidden."""
    done = subprocess.run(
        [sys.executable, "-m", "sp00ky_infra", "rehearse", str(config), "--jobs", str(jobs),
         "--workdir", str(workdir), "--json"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    try:
        report: dict[str, Any] = json.loads(done.stdout)
    except json.JSONDecodeError:
        message = f"rehearse printed no report (exit {done.returncode}):\n{done.stderr}"
        raise SystemExit(message) from None
    if done.returncode != 0:
        print(f"  the rehearsal failed (exit {done.returncode}): {report.get('failed')}",
              file=sys.stderr)  # fmt: skip
    return report


def with_image(config: Path, image: str | None) -> Path:
    """The example config, its pool's ``machine.image`` set when ``image`` is given."""
    if image is None:
        return config
    doc = yaml.safe_load(config.read_text())
    doc["pools"]["render"].setdefault("machine", {})["image"] = image
    path = config.with_name(f"sp00ky-{image.replace('/', '-')}.yml")
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def machines(report: dict[str, Any]) -> list[dict[str, float]]:
    """Each ready machine's phases and its total."""
    ready = []
    for machine in report.get("machines", []):
        if machine.get("outcome") != "ready":
            continue
        seconds = {p: float(v) for p, v in machine["phases"].items() if v is not None}
        seconds[TOTAL] = float(machine["created_to_ready"])
        ready.append(seconds)
    return ready


def summary(booted: Sequence[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Each phase's median and maximum over the machines that report it."""
    out = {}
    for phase in (*PHASES, TOTAL):
        values = [each[phase] for each in booted if phase in each]
        if values:
            out[phase] = {"median": statistics.median(values), "max": max(values)}
    return out


def show(path: str, booted: Sequence[dict[str, float]], estimate: dict[str, Any]) -> None:
    print(f"{path}: {len(booted)} machine(s) ready")
    print(f"  {'phase':<16}{'median':>10}{'max':>10}{'Hetzner est.':>14}")
    for phase, figures in summary(booted).items():
        guess = estimate.get("total" if phase == TOTAL else phase)
        shown = "-" if guess is None else f"{guess:.1f}s"
        print(f"  {phase:<16}{figures['median']:>9.1f}s{figures['max']:>9.1f}s{shown:>14}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2, help="jobs queued a round")
    parser.add_argument("--image", action="append", help="machine.image (repeat: paths)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as scratch:
        config = example_config(Path(scratch))
        for image in args.image or [None]:
            path = image or "the pool's image"
            booted: list[dict[str, float]] = []
            estimate: dict[str, Any] = {}
            for n in range(args.rounds):
                print(f"{path}: round {n + 1} of {args.rounds} ...", file=sys.stderr)
                workdir = Path(scratch) / f"work-{len(results)}-{n}"
                report = rehearse(with_image(config, image), args.jobs, workdir)
                booted += machines(report)
                estimate = report.get("estimate") or estimate
            results[path] = {"machines": booted, "summary": summary(booted), "estimate": estimate}
            if not args.json:
                show(path, booted, estimate)
    if args.json:
        print(json.dumps(results, indent=2))
    record(
        "boot",
        {
            f"{path}_{phase}_median_s".replace(" ", "_"): figures["median"]
            for path, found in results.items()
            for phase, figures in found["summary"].items()
        },
    )


if __name__ == "__main__":
    main()
