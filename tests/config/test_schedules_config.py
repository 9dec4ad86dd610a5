"""`schedules:` in sp00ky.yml: the lint rules' cases (run by test_lint_rules.py with every
other rule's), the schema's, and the typed values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sp00ky_infra.config import ConfigInvalid
from sp00ky_infra.config.loader import lint_file, load_config
from sp00ky_infra.config.model import build_config
from sp00ky_infra.policy.schedules import Cron, Interval
from tests.configs import lint_data, varied

NIGHTLY = {"cron": "0 3 * * *", "backend": "renderer", "route": "/render"}
EVERY = {"backend": "renderer", "route": "/render"}

# (code, changes, path, words the message must contain): test_lint_rules.py runs these.
SCHEDULE_FAILING: list[tuple[str, tuple[tuple[str, Any], ...], str, str]] = [
    (
        "SP160",
        (("schedules.nightly", {**NIGHTLY, "every": "1m"}),),
        "schedules.nightly.every",
        "has both cron and every; keep one",
    ),
    (
        "SP160",
        (("schedules.nightly", {"backend": "renderer", "route": "/render"}),),
        "schedules.nightly",
        "has no cadence; add `cron:",
    ),
    (
        "SP161",
        (("schedules.nightly", {**NIGHTLY, "cron": "0 24 * * *"}),),
        "schedules.nightly.cron",
        "the hour field of '0 24 * * *': 24 is out of range 0-23",
    ),
    (
        "SP161",
        (("schedules.nightly", {**NIGHTLY, "cron": "0 3 * *"}),),
        "schedules.nightly.cron",
        "has 4 fields; a cron expression has 5: minute hour day-of-month month day-of-week",
    ),
    (
        "SP162",
        (("schedules.tick", {**EVERY, "every": "500ms"}),),
        "schedules.tick.every",
        "shorter than 1s",
    ),
    (
        "SP162",
        (("schedules.nightly", {**NIGHTLY, "history": {"success": "15"}}),),
        "schedules.nightly.history.success",
        "add a unit: 15s",
    ),
    (
        "SP163",
        (("schedules.nightly", {**NIGHTLY, "backend": "rendrer"}),),
        "schedules.nightly.backend",
        "backend 'rendrer', which is not a backend app; did you mean 'renderer'?",
    ),
    (
        "SP163",
        (
            ("apps.api", {"type": "backend", "method": {"type": "outbox", "table": "job"}}),
            ("schedules.nightly", {**NIGHTLY, "backend": "api"}),
        ),
        "schedules.nightly.backend",
        "backend 'api' runs on no pool, so schedule 'nightly''s jobs could never run",
    ),
    (
        "SP163",
        (
            ("apps.api", {"type": "backend", "baseUrl": "http://127.0.0.1:9"}),
            ("schedules.nightly", {**NIGHTLY, "backend": "api"}),
        ),
        "schedules.nightly.backend",
        "backend 'api' has no outbox table",
    ),
    (
        "SP164",
        (("schedules.nightly", {**NIGHTLY, "route": "render"}),),
        "schedules.nightly.route",
        "route 'render' is not a path; write it as the backend's spec does, like /render",
    ),
    (
        "SP165",
        (("schedules.nightly", {**NIGHTLY, "concurrency": "replce"}),),
        "schedules.nightly.concurrency",
        "concurrency 'replce' is not a policy; use skip (the default), replace or allow; "
        "did you mean 'replace'?",
    ),
    (
        "SP166",
        (("schedules.nightly", {**NIGHTLY, "forEach": {"query": "SELECT id FROM tenant"}}),),
        "schedules.nightly.forEach",
        "forEach (one job per row of a query) is not supported",
    ),
]
SCHEDULE_PASSING: list[tuple[str, tuple[tuple[str, Any], ...]]] = [
    ("SP160", (("schedules.nightly", NIGHTLY),)),
    ("SP161", (("schedules.nightly", {**NIGHTLY, "cron": "*/15 8-18 * JAN-MAR mon-fri"}),)),
    (
        "SP162",
        (
            (
                "schedules.sync",
                {**EVERY, "every": "1m", "history": {"success": "15m"}},
            ),
        ),
    ),
    ("SP163", (("schedules.nightly", NIGHTLY),)),
    ("SP164", (("schedules.nightly", {**NIGHTLY, "route": "/render"}),)),
    ("SP165", (("schedules.nightly", {**NIGHTLY, "concurrency": "allow"}),)),
    ("SP166", (("schedules.nightly", NIGHTLY),)),
]


def test_an_unknown_schedule_key_gets_a_did_you_mean() -> None:
    issues = lint_data(varied(("schedules.nightly", {**NIGHTLY, "cronn": "0 3 * * *"})))
    assert [(issue.path, issue.message) for issue in issues] == [
        ("schedules.nightly.cronn", "unknown key 'cronn'; did you mean 'cron'?")
    ]


def test_a_schedule_needs_a_backend_and_a_route() -> None:
    issues = lint_data(varied(("schedules.nightly", {"cron": "0 3 * * *"})))
    assert sorted((issue.path, issue.message) for issue in issues) == [
        ("schedules.nightly.backend", "`backend` is required here"),
        ("schedules.nightly.route", "`route` is required here"),
    ]


def test_a_bad_policy_is_reported_once() -> None:
    issues = lint_data(varied(("schedules.nightly", {**NIGHTLY, "concurrency": "never"})))
    assert [issue.code for issue in issues] == ["SP165"]


def test_the_typed_schedules() -> None:
    data = varied(
        ("schedules.nightly", {**NIGHTLY, "payload": {"gameId": "g"}}),
        (
            "schedules.sync",
            {
                "every": "90s",
                "backend": "renderer",
                "route": "/render",
                "concurrency": "replace",
                "history": {"success": "15m", "failed": "30d"},
            },
        ),
    )
    assert lint_data(data) == []
    config = build_config(data)
    nightly, sync = config.schedules["nightly"], config.schedules["sync"]
    assert isinstance(nightly.cadence, Cron) and nightly.cadence_text == "cron 0 3 * * *"
    assert nightly.payload == {"gameId": "g"}
    assert nightly.concurrency == "skip"  # the docs' default
    assert (nightly.history_success, nightly.history_failed) == (None, None)
    assert sync.cadence == Interval(90.0) and sync.cadence_text == "every 1m30s"
    assert sync.concurrency == "replace"
    assert (sync.history_success, sync.history_failed) == (900.0, 30 * 86400.0)


def test_a_config_without_schedules_has_none() -> None:
    assert build_config(varied()).schedules == {}


@pytest.mark.parametrize("name", ["Nightly", "9am", "a_b"])
def test_schedule_names_are_like_pool_names(name: str) -> None:
    issues = lint_data(varied((f"schedules.{name}", NIGHTLY)))
    assert [issue.path for issue in issues] == [f"schedules.{name}"]


# --- routes and payloads against the backend's spec (config/routes.py, run by lint) ---------


def _lint_project(tmp_path: Path, schedule: dict[str, Any]) -> list[tuple[str, str, str]]:
    from tests.controller.test_schedules_controller import write_project

    issues = lint_file(write_project(tmp_path, {"nightly": schedule}))
    return [(issue.path, issue.code, issue.message) for issue in issues]


def test_a_route_the_spec_lacks_gets_a_did_you_mean(tmp_path: Path) -> None:
    schedule = {**NIGHTLY, "route": "/rendr", "payload": {"gameId": "g"}}
    assert _lint_project(tmp_path, schedule) == [
        (
            "schedules.nightly.route",
            "SP167",
            "backend 'renderer''s spec has no POST /rendr (its POST routes: /render); "
            "did you mean '/render'?",
        )
    ]


def test_a_payload_the_spec_refuses_is_named(tmp_path: Path) -> None:
    schedule = {**NIGHTLY, "payload": {"gameId": "g", "seconds": -1}}
    assert _lint_project(tmp_path, schedule) == [
        (
            "schedules.nightly.payload.seconds",
            "SP167",
            "payload.seconds: -1 is less than the minimum of 0 (the spec's POST /render body)",
        )
    ]
    assert _lint_project(tmp_path, {**NIGHTLY, "payload": {"gameId": "g"}}) == []


def test_a_config_with_a_refused_schedule_does_not_load(tmp_path: Path) -> None:
    from tests.controller.test_schedules_controller import write_project

    config = write_project(tmp_path, {"nightly": {**NIGHTLY, "route": "/nope"}})
    with pytest.raises(ConfigInvalid, match="spec has no POST /nope"):
        load_config(config)
