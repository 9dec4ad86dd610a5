"""The cost bench's reference days (bench/traces/make.py): the same bytes from every run of
the script, and each day the shape it claims, read as `simulate --trace` reads it."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections import Counter
from itertools import pairwise
from pathlib import Path

import pytest

from sp00ky_infra.simulate.workload import Arrival, read_trace
from tests.helpers import ROOT

MAKE = ROOT / "bench" / "traces" / "make.py"
HOUR = 3600.0
DAY = 24 * HOUR
# The traces are not kept in the repository (the steady day is 2.6 MB): their digests are, so
# that a change to how they are drawn cannot pass for the same reference day.
DIGESTS = {
    "steady.csv": "1323aa617323e4502f991df23791e3cdd4605fc7d5c057af66989c8e1efee0f3",
    "bursty.csv": "4e90d1e4364493ced588ae2be7de1c509c931186a912f0064da054ce006ea781",
    "business.csv": "ee2cbb678cdfecab6c7bb4751451411f871eaadd724fe574875d9682bc300ca6",
}


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("traces")
    subprocess.run([sys.executable, str(MAKE), "--out", str(folder)], check=True, timeout=120)
    return folder


@pytest.fixture(scope="module")
def days(made: Path) -> dict[str, list[Arrival]]:
    return {name.removesuffix(".csv"): read_trace(made / name) for name in DIGESTS}


def per_hour(arrivals: list[Arrival]) -> list[int]:
    counts = Counter(int(a.at // HOUR) for a in arrivals)
    return [counts[hour] for hour in range(24)]


def test_the_script_writes_the_reference_bytes(made: Path) -> None:
    written = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in made.iterdir()}
    assert written == DIGESTS


def test_one_trace_alone_is_the_same_bytes(made: Path, tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(MAKE), "--out", str(tmp_path), "--only", "bursty"],
        check=True,
        timeout=120,
    )
    assert [p.name for p in tmp_path.iterdir()] == ["bursty.csv"]
    assert (tmp_path / "bursty.csv").read_bytes() == (made / "bursty.csv").read_bytes()


def test_every_job_lasts_2_to_60_seconds_26_on_average(
    days: dict[str, list[Arrival]],
) -> None:
    for arrivals in days.values():
        durations = [a.duration for a in arrivals]
        assert min(durations) == 2.0 and max(durations) == 60.0
        # exp 30 s kept within 2..60 s averages 26.0 s
        assert 25.0 < sum(durations) / len(durations) < 27.5
        assert all(a.slots == 1 and a.delay == 0.0 and a.backend is None for a in arrivals)


def test_steady_is_about_100000_jobs_less_than_a_second_apart_all_day(
    days: dict[str, list[Arrival]],
) -> None:
    steady = days["steady"]
    assert 99_000 <= len(steady) <= 101_000
    assert steady[-1].at - steady[0].at < DAY
    assert (steady[-1].at - steady[0].at) / (len(steady) - 1) < 1.0
    assert all(3_800 <= n <= 4_500 for n in per_hour(steady))


def test_bursty_is_20_bursts_of_300_over_a_trickle(days: dict[str, list[Arrival]]) -> None:
    bursty = days["bursty"]
    at_once = Counter(a.at for a in bursty)
    bursts = sorted(at for at, n in at_once.items() if n > 1)
    assert len(bursts) == 20 and all(at_once[at] == 300 for at in bursts)
    gaps = [b - a for a, b in pairwise(bursts)]
    assert min(gaps) < 3600 < max(gaps)  # at random: some within the hour, some not
    assert bursts[0] > 0 and bursts[-1] < DAY
    trickle = len(bursty) - 20 * 300
    assert 1_300 <= trickle <= 1_600  # 60 an hour
    assert all(n >= 30 for n in per_hour([a for a in bursty if at_once[a.at] == 1]))


def test_business_runs_8_to_18_ramping_up_to_noon_and_down_after(
    days: dict[str, list[Arrival]],
) -> None:
    hours = per_hour(days["business"])
    assert hours[:8] == [0] * 8 and hours[18:] == [0] * 6
    day = hours[8:18]
    assert day[:5] == sorted(day[:5]) and day[5:] == sorted(day[5:], reverse=True)
    assert day[0] < day[4] / 4 and day[-1] < day[5] / 4
    assert 22_000 <= sum(day) <= 23_600
