"""Hetzner API budget benchmark: the requests an hour of a controller holding 50 machines
spends, out of the 3,600 an hour Hetzner allows a project.

    .venv/bin/python bench/api_budget.py [--rounds 2] [--no-engine]

1. The hour of tests/hetzner/api_hour.py on a fake clock, counted by the fake Hetzner API:
   60 controller ticks (heartbeat, prices, the server sweep), a scale event a minute (one
   machine made, then one destroyed, in turn, by the machine provider in process) and a
   guardian pass every 5 minutes; each kind's requests by method and path.
2. Real ``pulumi up``s on the engine of scripts/pulumi-engine, the stack holding 50 machines:
   ``--rounds`` scale-ups, scale-downs, unchanged ups and ``pulumi refresh``es, each one's
   requests.
3. The hour composed of the two: the ticks and passes as counted, 30 scale-ups and 30
   scale-downs at the engine's counts; beside it the hour with the heartbeat stamped as a
   listing and a PUT each minute (its firewall looked up every time).
Target: the hour under a third of the budget (1,200 requests).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from record import record

from sp00ky_infra.hetzner import HetznerAPI
from sp00ky_infra.hetzner.heartbeat import stamp_heartbeat
from sp00ky_infra.rehearse.cloud import TOKEN, FakeHetzner
from tests.hetzner.api_hour import MINUTES, PROJECT, Hour, a_stack, an_hour, measured_ups

ROOT = Path(__file__).resolve().parent.parent
TARGET = 3600 // 3


def _line(kind: str, spent: Counter[str]) -> str:
    return f"  {kind:<12} {sum(spent.values()):>5}  {dict(sorted(spent.items()))}"


def the_hour(folder: Path) -> Hour:
    with an_hour(folder) as hour:
        hour.run()
    return hour


def engine_ups(folder: Path, rounds: int) -> dict[str, list[Counter[str]]] | None:
    """Each kind of scale event's requests per real ``pulumi up``; None without the engine."""
    found = subprocess.run(
        [str(ROOT / "scripts" / "pulumi-engine"), "--path"], capture_output=True, text=True
    )
    if found.returncode != 0:
        print("no Pulumi engine (build it with scripts/pulumi-engine): real ups skipped")
        return None
    with FakeHetzner() as cloud:
        stack, revision = a_stack(folder, found.stdout.strip(), cloud)
        return measured_ups(stack, cloud, revision, rounds)


def listed_heartbeats() -> int:
    """An hour of heartbeats stamped as one listing and one PUT each (no kept id)."""
    with FakeHetzner() as cloud:
        api = HetznerAPI(TOKEN, cloud.url)
        for minute in range(MINUTES):
            stamp_heartbeat(api, PROJECT, 60.0 * minute)
        return sum(cloud.counted().values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="real ups of each kind")
    parser.add_argument("--no-engine", action="store_true", help="skip the real ups")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        hour = the_hour(Path(folder) / "hour")
        ups = None if args.no_engine else engine_ups(Path(folder) / "engine", args.rounds)
    print("the hour on a fake clock (requests, by method and path):")
    for kind, spent in hour.spent.items():
        print(_line(kind, spent))
    total = hour.total()
    figures = {"hour_requests": float(total)}
    if ups is not None:
        print(f"real pulumi ups of the 50-machine stack ({args.rounds} of each):")
        for kind, each in ups.items():
            for spent in each:
                print(_line(kind, spent))
        per_up = {kind: max(sum(s.values()) for s in each) for kind, each in ups.items()}
        events = sum(sum(hour.spent[kind].values()) for kind in ("scale_up", "scale_down"))
        total = total - events + (MINUTES // 2) * (per_up["scale_up"] + per_up["scale_down"])
        figures |= {f"{kind}_up_requests": float(n) for kind, n in per_up.items()}
        figures["hour_requests_engine"] = float(total)
    heartbeat = sum(n for request, n in hour.spent["tick"].items() if "/firewalls" in request)
    listed = total - heartbeat + listed_heartbeats()
    figures["hour_requests_listed_heartbeat"] = float(listed)
    print(f"the hour: {total} requests of 3600 ({total / 3600:.1%}; target under {TARGET})")
    print(f"  with the heartbeat's firewall listed at every stamp: {listed} requests")
    record("api_budget", figures)


if __name__ == "__main__":
    main()
