"""The image paths side by side, from hand-made timelines: pure, no Docker engine needed.
Each machine's phases, their median and maximum per path, what each boot downloaded, and
the Hetzner estimate with a source (or the word assumed) on every figure."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from sp00ky_infra.cli.rehearse import paths_table, render, render_paths
from sp00ky_infra.rehearse.paths import path_config
from sp00ky_infra.rehearse.phases import (
    DOCKER_INSTALL,
    DOCKER_INSTALL_SECONDS,
    ESTIMATE,
    FLEETING_LOG,
    PATH_IMAGES,
    PATHS,
    PHASES,
    SNAPSHOT_CREATE,
    SNAPSHOT_PATHS,
    TOTAL,
    Timeline,
    count_downloads,
    downloads,
    estimate,
    estimate_figures,
    parse_paths,
    phases,
    side_by_side,
)
from sp00ky_infra.rehearse.rehearsal import MachineReport, RehearsalReport
from tests.pulumi_engine import example_config

T0 = 1_765_000_000.0


@dataclass(frozen=True)
class Row:
    """A machine row as the controller keeps it."""

    created_at: float
    joined_at: float | None = None
    ready_at: float | None = None
    failed_reason: str | None = None


def _boot(
    create: float, cloud_init: float, install: float, image: float
) -> dict[str, float | None]:
    """One machine's phases, read from a timeline made by hand: pulumi up 3 s, then
    ``create``, ``cloud_init``, ``install``, ``image`` seconds, a healthcheck of 1 s."""
    requested = T0 + 3
    started = requested + create
    final = started + cloud_init
    joined = final + install
    image_ready = joined + image
    timeline = Timeline(
        requested=requested,
        container_started=started,
        stages={"modules-final": (final, final + 1)},
    )
    row = Row(created_at=T0, joined_at=joined, ready_at=image_ready + 1)
    found = phases(row, timeline, {"image_ready": image_ready})
    return {**found, TOTAL: round(image_ready + 1 - T0, 2)}


def test_a_machines_phases_are_read_from_the_controller_the_cloud_and_the_agent() -> None:
    assert _boot(2, 4, 1.5, 6) == {
        "pulumi up": 3.0, "create": 2.0, "cloud-init": 4.0, "agent install": 1.5,
        "image": 6.0, "healthcheck": 1.0, TOTAL: 17.5,
    }  # fmt: skip


def test_paths_side_by_side_give_each_phase_its_median_and_max_per_path() -> None:
    default = [_boot(2, 4, 1, 6), _boot(3, 5, 2, 8), _boot(2, 4, 1, 7)]
    fallback = [_boot(2, 4, 24, 9), _boot(2, 5, 30, 9)]
    baked = [{**_boot(2, 4, 1, 0.5), "image": None}]  # an image nobody saw arrive
    table = side_by_side({"default": default, "fallback": fallback, "baked": baked})
    assert list(table) == [*PHASES, TOTAL]
    assert table["agent install"] == {
        "default": (1.0, 2.0),
        "fallback": (27.0, 30.0),
        "baked": (1.0, 1.0),
    }
    assert table["image"]["baked"] is None  # no machine of the path saw it
    assert table[TOTAL]["default"] == (18.0, 22.0)
    assert side_by_side({"default": []})["create"] == {"default": None}


def test_a_default_boot_fetches_the_agent_and_the_image() -> None:
    lines = ["Cloud-init v. 22.4.2 running", "sp00ky-bootstrap event=installed sha256=abc"]
    found = downloads({"joined": T0, "image_fetch": T0 + 1, "image_ready": T0 + 5}, lines)
    assert found == {
        "agent fetched": True, "agent present": False,
        "image fetched": True, "image cached": False,
    }  # fmt: skip


def test_a_baked_boot_fetches_nothing() -> None:
    lines = ["sp00ky-bootstrap event=agent_present", "sp00ky-bootstrap event=installed x"]
    found = downloads({"joined": T0, "image_cached": T0 + 1}, lines)
    assert found == {
        "agent fetched": False, "agent present": True,
        "image fetched": False, "image cached": True,
    }  # fmt: skip


def test_a_boot_that_never_got_that_far_downloaded_nothing_yet() -> None:
    assert not any(downloads({}, ["sp00ky-bootstrap event=retry url=x"]).values())


def test_downloads_are_counted_per_path() -> None:
    fetched = downloads({"image_ready": T0}, ["sp00ky-bootstrap event=agent_fetched"])
    present = downloads({"image_cached": T0}, ["sp00ky-bootstrap event=agent_present"])
    assert count_downloads([fetched, fetched, present]) == {
        "agent fetched": 2, "agent present": 1, "image fetched": 2, "image cached": 1,
    }  # fmt: skip
    assert count_downloads([]) == dict.fromkeys(count_downloads([fetched]), 0)


def test_every_hetzner_figure_carries_its_source_or_the_word_assumed() -> None:
    for figure in (*ESTIMATE.values(), DOCKER_INSTALL, SNAPSHOT_CREATE):
        if figure.seconds is not None:
            assert "assumed" in figure.source or "http" in figure.source, figure
    create = ESTIMATE["create"]
    assert create.seconds == 16.0 and FLEETING_LOG in create.source
    assert "09:57:26" in create.source and "09:57:42" in create.source  # the log's two lines
    assert DOCKER_INSTALL.seconds == DOCKER_INSTALL_SECONDS
    assert DOCKER_INSTALL.source.startswith("assumed: ") and "took=1m5.3s" in DOCKER_INSTALL.source
    assert SNAPSHOT_CREATE.source.startswith("assumed: ")
    assert "terraform-provider-hcloud/issues/312" in SNAPSHOT_CREATE.source


def test_the_estimate_says_where_each_phase_comes_from() -> None:
    ready = [_boot(2, 4, 1, 6), _boot(3, 5, 2, 8)]
    figures = estimate_figures(ready)
    assert figures["create"] == ESTIMATE["create"]
    assert figures["image"].seconds == 7.0
    assert figures["image"].source.startswith("measured here (the ready machines' median)")
    baked = estimate_figures(ready, snapshot=True)
    assert baked["create"] == SNAPSHOT_CREATE
    unmeasured = estimate_figures(ready, unmeasured_install=True)
    assert unmeasured["agent install"].seconds == 1.5 + DOCKER_INSTALL_SECONDS
    assert "assumed" in unmeasured["agent install"].source
    seconds = estimate(ready)
    assert seconds["total"] == round(sum(f.seconds or 0 for f in figures.values()), 1)


def test_paths_are_all_or_some_in_the_order_given() -> None:
    assert parse_paths("all") == PATHS == ("default", "fallback", "baked")
    assert parse_paths("baked, default,baked") == ("baked", "default")
    assert (PATH_IMAGES["default"], PATH_IMAGES["fallback"]) == ("docker-ce", "debian-12")
    assert SNAPSHOT_PATHS == ("baked",)
    with pytest.raises(ValueError) as unknown:
        parse_paths("default,snapshot")
    assert (
        str(unknown.value) == "unknown path snapshot: say all, or some of default, fallback, baked"
    )
    with pytest.raises(ValueError, match="unknown path ','"):
        parse_paths(",")


def test_a_paths_config_is_the_users_beside_it_with_only_the_image_changed(
    tmp_path: Path,
) -> None:
    source = tmp_path / "sp00ky.yml"
    doc = {"pools": {"render": {"max": 2, "machine": {"type": "cx33"}}, "gpu": {"max": 1}}}
    source.write_text(yaml.safe_dump(doc))
    made = path_config(source, {"render": "debian-12", "gpu": "sp00ky/recipe=abc"})
    assert made.parent == source.parent and made.name.startswith(".sp00ky.rehearse-")
    assert yaml.safe_load(made.read_text()) == {
        "pools": {
            "render": {"max": 2, "machine": {"type": "cx33", "image": "debian-12"}},
            "gpu": {"max": 1, "machine": {"image": "sp00ky/recipe=abc"}},
        }
    }
    assert yaml.safe_load(source.read_text()) == doc  # the user's own is untouched


def _report(path: str, machines: list[dict[str, float | None]], **extra: object) -> RehearsalReport:
    ready = [
        MachineReport(f"render-{n}", "render", n, "ready", phases=m, created_to_ready=m[TOTAL])
        for n, m in enumerate(machines, 1)
    ]
    report = RehearsalReport("sp00ky.yml", ["render"], machines=ready, path=path)
    snapshot = path == "baked"
    figures = estimate_figures([m.phases for m in ready], snapshot=snapshot)
    report.estimate = estimate([m.phases for m in ready], snapshot=snapshot)
    report.estimate_sources = {phase: f.source for phase, f in figures.items()}
    for key, value in extra.items():
        setattr(report, key, value)
    return report


def _three_paths() -> dict[str, RehearsalReport]:
    return {
        "default": _report(
            "default", [_boot(2, 4, 1, 6), _boot(3, 5, 2, 8)],
            downloads={"agent fetched": 2, "image fetched": 2},
        ),
        "fallback": _report(
            "fallback", [_boot(2, 4, 24, 9)], downloads={"agent fetched": 1, "image fetched": 1}
        ),
        "baked": _report(
            "baked", [_boot(2, 4, 1, 0.4)], bake_seconds=48.3,
            downloads={"agent present": 1, "image cached": 1},
            cloud=["render: booted from the pool's baked snapshot"],
        ),
    }  # fmt: skip


def test_the_paths_report_sets_them_side_by_side_with_the_sources_under_it() -> None:
    lines = render_paths(_three_paths())
    text = "\n".join(lines)
    header = next(line for line in lines if "median (max)" in line)
    assert header.split() == ["median", "(max)", "default", "fallback", "baked"]
    install = next(line for line in lines if line.strip().startswith("agent install"))
    assert install.split()[2:] == ["1.5s", "(2.0)", "24.0s", "(24.0)", "1.0s", "(1.0)"]
    total = next(line for line in lines if line.strip().startswith(TOTAL))
    assert total.split()[1:3] == ["19.5s", "(22.0)"]
    assert next(line for line in lines if "image fetched" in line).split()[2:] == ["2", "1", "0"]
    assert next(line for line in lines if "agent present" in line).split()[2:] == ["0", "0", "1"]
    assert next(line for line in lines if line.strip().startswith("bake")).split()[1:] == [
        "-", "-", "48.3s",
    ]  # fmt: skip
    assert "outside every machine's create-to-ready" in text
    estimated = lines[lines.index("estimated create-to-ready on Hetzner:") + 2]
    assert estimated.split() == ["create", "16.0s", "[2]", "16.0s", "[2]", "16.0s", "[3]"]
    sources = lines[lines.index("  sources:") :]
    assert any(FLEETING_LOG in line and line.startswith("    [2] ") for line in sources)
    assert any(line.startswith("    [3] assumed: ") for line in sources)
    assert "render: booted from the pool's baked snapshot" in text
    assert lines[-1].startswith("verdict: ok (default ok, fallback ok, baked ok) in ")


def test_the_paths_json_has_the_table_of_medians_and_maxima() -> None:
    table = paths_table(_three_paths())
    assert table["agent install"]["fallback"] == {"median": 24.0, "max": 24.0}
    assert table[TOTAL]["default"] == {"median": 19.5, "max": 22.0}
    json.dumps(table)  # as printed


def test_one_paths_report_prints_its_estimate_with_sources() -> None:
    lines = render(_three_paths()["default"])
    create = next(line for line in lines if line.strip().startswith("create") and "[" in line)
    assert create.split() == ["create", "16.0s", "[2]"]
    assert any(line.startswith("    [2] POST /servers to a running server") for line in lines)


def test_an_unknown_path_is_a_usage_error_that_names_the_paths() -> None:
    from click.testing import CliRunner

    from sp00ky_infra.cli.rehearse import rehearse

    done = CliRunner().invoke(rehearse, ["sp00ky.yml", "--paths", "default,snapshot"])
    assert done.exit_code == 2
    assert "Invalid value for --paths: unknown path snapshot: say all, or some of default, " in (
        done.output
    )


@pytest.mark.parametrize(
    ("path", "finding"),
    [
        (None, "render: image docker-ce has Docker"),
        ("default", "render: image docker-ce has Docker"),
        ("fallback", "render: image debian-12 has no Docker"),
        ("baked", "render: machine.image baked: its snapshot is baked before the burst"),
    ],
)
def test_the_servers_boot_the_image_of_the_path_rehearsed(
    tmp_path: Path, path: str | None, finding: str
) -> None:
    from sp00ky_infra.config.loader import load_config
    from sp00ky_infra.rehearse.rehearsal import Rehearsal

    config_file = example_config(tmp_path)
    rehearsal = Rehearsal(config_file, path=path)
    report = RehearsalReport(str(config_file), ["render"], path=path)
    rehearsal._booter(load_config(config_file), ["render"], "sp00ky-rehearse/any", report)
    assert any(line.startswith(finding) for line in report.cloud), report.cloud
