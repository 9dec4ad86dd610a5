"""`simulate` leads to a decision: a sweep prints every setting with the front marked and the
one to choose with the figure that decided it; a window shorter than a day is said; traces
take ISO 8601 times; the picture's axes are round times and euros, its labels apart."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from sp00ky_infra.config.model import Pool
from sp00ky_infra.policy.cost import HETZNER_PRICES
from sp00ky_infra.simulate.chart import euro_step, svg, time_label, time_step
from sp00ky_infra.simulate.providers import PROVIDERS
from sp00ky_infra.simulate.runner import Run
from sp00ky_infra.simulate.sweep import Point, on_front, recommend
from sp00ky_infra.simulate.workload import TRACE_COLUMNS, WorkloadError, read_trace
from tests.helpers import ROOT, cli

EXAMPLE = ROOT / "examples" / "sp00ky.yml"
# A morning of the example's render jobs, stamped as a job store's export in another zone
# would be: ten jobs from 09:00 UTC, a few minutes each, over about 80 minutes.
MORNING = [
    ("2026-03-02T09:00:00Z", "4m"),
    ("2026-03-02T10:03:00+01:00", "3m"),
    ("2026-03-02T09:10:30Z", "5m"),
    ("2026-03-02T09:21:00Z", "2m"),
    ("2026-03-02T10:25:00+01:00", "4m"),
    ("2026-03-02T09:40:00Z", "6m"),
    ("2026-03-02T09:52:00Z", "3m"),
    ("2026-03-02T10:01:00Z", "4m"),
    ("2026-03-02T11:13:00+01:00", "2m"),
    ("2026-03-02T10:20:00Z", "5m"),
]


@pytest.fixture
def morning(tmp_path: Path) -> Path:
    path = tmp_path / "morning.csv"
    path.write_text("at,duration\n" + "".join(f"{at},{d}\n" for at, d in MORNING))
    return path


def _point(label: str, wait: float, euros: float, timeouts: int = 0) -> Point:
    report = Run(Pool("p", min=0), [], PROVIDERS["local"], HETZNER_PRICES["cx33"]).report()
    changed = replace(report, wait_p95=wait, euros_per_day=euros, queue_timeouts=timeouts)
    return Point(label, changed)


# --- traces -----------------------------------------------------------------------------------


def test_iso_times_with_an_offset_or_z_are_the_instants_they_name(
    morning: Path, tmp_path: Path
) -> None:
    arrivals = read_trace(morning)
    assert [a.at for a in arrivals] == [0, 180, 630, 1260, 1500, 2400, 3120, 3660, 4380, 4800]
    unix = tmp_path / "unix.jsonl"
    unix.write_text('{"at": 1772442000, "duration": 60}\n{"at": "2026-03-02T09:01:00Z", '
                    '"duration": "1m"}\n')  # fmt: skip
    assert [a.at for a in read_trace(unix)] == [0.0, 60.0]


def test_an_iso_time_without_an_offset_names_its_line_and_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "naive.csv"
    path.write_text("at,duration\n2026-03-02T09:00:00Z,1m\n2026-03-02T09:05:00,1m\n")
    with pytest.raises(WorkloadError) as refused:
        read_trace(path)
    assert str(refused.value) == (
        "line 3: at: '2026-03-02T09:05:00' has no offset, so the instant it names is not "
        "known; add one (Z for UTC, or +01:00), e.g. 2026-03-02T09:05:00Z"
    )


def test_the_help_says_each_column_of_a_trace_and_its_unit() -> None:
    done = cli("simulate", "--help", env={"COLUMNS": "100"})
    text = " ".join(done.stdout.split())
    for name, meaning in TRACE_COLUMNS:
        assert f"{name} {meaning}" in text
    assert "ISO 8601 time with its offset (2026-01-01T09:00:00Z" in text


# --- the window -------------------------------------------------------------------------------


def test_a_trace_shorter_than_a_day_is_warned_of_not_scaled_in_silence(morning: Path) -> None:
    base = ("simulate", "--config", str(EXAMPLE), "--trace", str(morning))
    done = cli(*base)
    assert done.returncode == 0, done.stderr
    (row,) = [line for line in done.stdout.splitlines() if "euros per day" in line]
    window = re.search(r"the bill over the first ([0-9.]+)h, scaled to a day", row)
    assert window is not None, row
    assert done.stderr.startswith(
        f"warning: the window is {window[1]}h, shorter than a day: EUR/day is its bill x "
    )
    assert "give --window 24h to bill a day with only this work" in done.stderr
    whole_day = cli(*base, "--window", "24h")
    assert whole_day.returncode == 0, whole_day.stderr
    assert whole_day.stderr == ""
    data = json.loads(cli(*base, "--json").stdout)
    assert data["window_warning"].startswith(f"the window is {window[1]}h, shorter than a day")
    assert json.loads(cli(*base, "--window", "1d", "--json").stdout)["window_warning"] is None


# --- the decision -----------------------------------------------------------------------------


def test_the_cheapest_within_the_wait_is_chosen_by_its_euros() -> None:
    points = [
        _point("a", 90.0, 0.10),
        _point("b", 40.0, 0.30),
        _point("c", 40.0, 0.30),  # the same figures as b: b was given first
        _point("d", 0.0, 0.50),
        _point("e", 10.0, 0.20, timeouts=3),  # cheap and quick, but it drops jobs
    ]
    chosen = recommend(points, max_wait=60.0)
    assert (chosen.point.label, chosen.decided_by) == ("b", "EUR/day")
    assert chosen.reason == (
        "the cheapest (0.30 EUR/day, wait p95 40.0s) of the 3 settings whose wait p95 is at "
        "most 1.0m; 1 setting(s) whose jobs hit queueTimeout or were refused left out"
    )
    assert recommend(points).point.label == "a"
    assert "give --max-wait" in recommend(points).reason
    none_so_quick = recommend(points[:4], max_wait=-1.0)
    assert (none_so_quick.point.label, none_so_quick.decided_by) == ("d", "wait p95")
    assert on_front(points[:4]) == [True, True, True, True]
    assert on_front(points) == [True, False, False, True, True]


def test_a_sweep_prints_every_setting_marks_the_front_and_says_what_decided(
    morning: Path, tmp_path: Path
) -> None:
    picture = tmp_path / "sweep.svg"
    done = cli(
        "simulate", "--config", str(EXAMPLE), "--trace", str(morning), "--window", "24h",
        "--sweep", "min=0,1", "--sweep", "buffer=0,1", "--max-wait", "1m", "--workers", "1",
        "--out", str(picture),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    head = lines.index(next(line for line in lines if line.lstrip().startswith("setting")))
    rows = lines[head + 1 : head + 5]
    assert sorted(re.sub(r"^\*?\s+", "", r).split("  ")[0] for r in rows) == sorted(
        ["min=0 buffer=0", "min=0 buffer=1", "min=1 buffer=0", "min=1 buffer=1"]
    )
    marked = [r for r in rows if r.startswith("*")]
    assert lines[0].startswith(f"pool render: 4 settings, {len(marked)} on the Pareto front")
    (decision,) = [line for line in lines if line.startswith("recommended: ")]
    reason = lines[lines.index(decision) + 1]
    assert reason.startswith("  decided by EUR/day: the cheapest (")
    assert "of the" in reason and "whose wait p95 is at most 1.0m" in reason
    chosen = decision.removeprefix("recommended: ")
    assert any(r.startswith("*") and chosen in r for r in rows)  # the choice is on the front
    assert "(recommended, ringed)" in picture.read_text()
    assert chosen in picture.read_text()
    data = json.loads(
        cli("simulate", "--config", str(EXAMPLE), "--trace", str(morning), "--window", "24h",
            "--sweep", "min=0,1", "--max-wait", "1s", "--workers", "1", "--json").stdout
    )  # fmt: skip
    assert [p["on_front"] for p in data["points"]].count(True) >= 1
    assert data["recommended"]["decided_by"] == "wait p95"
    assert data["recommended"]["reason"].startswith("no setting keeps wait p95 within 1.0s")


# --- the picture ------------------------------------------------------------------------------


def test_time_and_euro_axes_take_round_steps() -> None:
    assert [time_step(top) for top in (4, 45, 75, 600, 5000, 40000)] == [
        1.0, 10.0, 15.0, 120.0, 1200.0, 10800.0,
    ]  # fmt: skip
    assert [time_label(s) for s in (0, 45, 60, 90, 3600, 5400)] == [
        "0s", "45s", "1m", "1m30s", "1h", "1h30m",
    ]  # fmt: skip
    assert [euro_step(top) for top in (0.33, 1.7, 12.0)] == [0.1, 0.5, 5.0]


TEXT = re.compile(r'<text x="([0-9.]+)" y="([0-9.]+)"([^>]*)>([^<]*)</text>')


def _boxes(picture: str) -> list[tuple[str, tuple[float, float, float, float]]]:
    """Each label's text and box (a character about 0.55 em wide), the rotated title aside."""
    found = []
    for x, y, attributes, text in TEXT.findall(picture):
        if "rotate" in attributes:
            continue
        size = float(m[1]) if (m := re.search(r'font-size="(\d+)"', attributes)) else 12.0
        width = 0.55 * size * len(text)
        left = float(x) - (width / 2 if 'text-anchor="middle"' in attributes else 0.0)
        left -= width if 'text-anchor="end"' in attributes else 0.0
        found.append((text, (left, float(y) - size, left + width, float(y))))
    return found


def test_the_picture_s_labels_stay_apart_and_inside_it() -> None:
    """Settings close together and alike, as a sweep of idleTimeout gives: every label still
    clear of the others, and of the picture's edges; each on the front named under it."""
    points = [
        _point("min=0 buffer=0 idleTimeout=1m", 66.0, 0.10),
        _point("min=0 buffer=0 idleTimeout=15m", 64.0, 0.11),
        _point("min=0 buffer=0 idleTimeout=5m", 64.5, 0.11),
        _point("min=1 buffer=0 idleTimeout=15m", 46.2, 0.28),
        *(
            _point(f"min={m} buffer=1 idleTimeout={t}", 0.0, 0.33)
            for m in (0, 1)
            for t in ("1m", "5m")
        ),
        *(_point(f"min=2 buffer={b} idleTimeout=5m", 0.0, 0.54) for b in (0, 1, 2)),
    ]
    picture = svg(points, "pool render: wait p95 against EUR per day", recommend(points, 60.0))
    width = float(re.search(r'width="(\d+)"', picture)[1])  # type: ignore[index]
    boxes = _boxes(picture)
    for text, (left, _, right, _) in boxes:
        assert left >= 0 and right <= width, text
    for i, (text, box) in enumerate(boxes):
        for other, against in boxes[i + 1 :]:
            apart = box[2] <= against[0] or against[2] <= box[0]
            assert apart or box[3] <= against[1] or against[3] <= box[1], (text, other)
    ticks = [text for text, _ in boxes if re.fullmatch(r"\d+[smh]\d*[sm]?", text)]
    assert ticks == ["0s", "15s", "30s", "45s", "1m", "1m15s"]
    assert "cost (EUR per day)" in picture and "(time)</text>" in picture
    legend = [text for text, _ in boxes if re.match(r"\d  ", text)]
    assert legend == [
        "1  min=0 buffer=0 idleTimeout=1m: wait p95 1.1m, 0.10 EUR/day",
        "2  min=0 buffer=0 idleTimeout=15m: wait p95 1.1m, 0.11 EUR/day",
        "3  min=1 buffer=0 idleTimeout=15m: wait p95 46.2s, 0.28 EUR/day (recommended, ringed)",
        "4  min=0 buffer=1 idleTimeout=1m (and 3 more with these figures): wait p95 0.0s, "
        "0.33 EUR/day",
    ]
    assert ">x3</text>" in picture  # the three alike off the front share one marker
