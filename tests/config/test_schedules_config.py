"""`schedules:` in sp00ky.yml: the lint rules' cases (run by test_lint_rules.py with every
other rule's), the schema's, and the typed values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sp00ky_infra.config import ConfigInvalid
from sp00ky_infra.config.durations import parse_duration
from sp00ky_infra.config.loader import lint_file, load_config
from sp00ky_infra.config.model import ForEach, build_config
from sp00ky_infra.config.schema import load_schema
from sp00ky_infra.policy.schedules import (
    DEFAULT_FOR_EACH_MAX_ROWS,
    DEFAULT_FOR_EACH_TIMEOUT,
    Cron,
    Interval,
)
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
        (
            (
                "schedules.nightly",
                {**NIGHTLY, "forEach": {"query": "DELETE FROM tenant", "key": "id"}},
            ),
        ),
        "schedules.nightly.forEach.query",
        "the query starts with DELETE, not SELECT; it may only read rows",
    ),
    (
        "SP166",
        (
            (
                "schedules.nightly",
                {**NIGHTLY, "forEach": {"query": "SELECT id FROM t; DROP TABLE t", "key": "id"}},
            ),
        ),
        "schedules.nightly.forEach.query",
        "the query holds more than one statement; write a single SELECT",
    ),
    (
        "SP168",
        (
            (
                "schedules.nightly",
                {**NIGHTLY, "forEach": {"query": "SELECT id FROM t", "key": "i d"}},
            ),
        ),
        "schedules.nightly.forEach.key",
        "key 'i d' is not a column name; name the column that identifies a row, like id",
    ),
    (
        "SP168",
        (
            (
                "schedules.nightly",
                {**NIGHTLY, "forEach": {"query": "SELECT t.id, name FROM t", "key": "ids"}},
            ),
        ),
        "schedules.nightly.forEach.key",
        "key 'ids' is not a column of the query's rows (id, name); did you mean 'id'?",
    ),
    (
        "SP169",
        (
            (
                "schedules.nightly",
                {**NIGHTLY, "payload": [1], "forEach": {"query": "SELECT id FROM t", "key": "id"}},
            ),
        ),
        "schedules.nightly.payload",
        "a fan-out's payload must be an object: each row's job gets its id added to it",
    ),
]
# The Jobs docs' fan-out example, as sp00ky.yml writes it.
SYNC_EVERY_TENANT = {
    "every": "1m",
    "backend": "renderer",
    "route": "/render",
    "forEach": {"query": "SELECT id FROM tenant", "key": "id"},
    "history": {"success": "15m", "failed": "30d"},
}
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
    ("SP166", (("schedules.sync-every-tenant", SYNC_EVERY_TENANT),)),
    ("SP168", (("schedules.sync-every-tenant", SYNC_EVERY_TENANT),)),
    (
        "SP168",
        (
            (
                "schedules.wide",
                {**SYNC_EVERY_TENANT, "forEach": {"query": "SELECT * FROM tenant", "key": "id"}},
            ),
        ),
    ),
    ("SP169", (("schedules.sync-every-tenant", {**SYNC_EVERY_TENANT, "payload": {"full": True}}),)),
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


def test_a_fan_out_payload_is_checked_as_its_rows_jobs_carry_it(tmp_path: Path) -> None:
    """The spec requires gameId, which each row's key gives: a fan-out without a payload
    lints clean; what the payload itself gets wrong is still named."""
    for_each = {"query": 'SELECT id AS "gameId" FROM game', "key": "gameId"}
    assert _lint_project(tmp_path, {**NIGHTLY, "forEach": for_each}) == []
    refused = {**NIGHTLY, "forEach": for_each, "payload": {"seconds": -1}}
    assert _lint_project(tmp_path, refused) == [
        (
            "schedules.nightly.payload.seconds",
            "SP167",
            "payload.seconds: -1 is less than the minimum of 0 (the spec's POST /render body)",
        )
    ]


def test_the_typed_fan_out() -> None:
    data = varied(
        ("schedules.sync-every-tenant", SYNC_EVERY_TENANT),
        (
            "schedules.wide",
            {
                **SYNC_EVERY_TENANT,
                "forEach": {
                    "query": "SELECT id FROM t",
                    "key": "id",
                    "maxRows": 5,
                    "timeout": "2s",
                },
            },
        ),
    )
    assert lint_data(data) == []
    config = build_config(data)
    sync, wide = config.schedules["sync-every-tenant"], config.schedules["wide"]
    assert sync.for_each == ForEach("SELECT id FROM tenant", "id", 10_000, 10.0)  # the defaults
    assert wide.for_each == ForEach("SELECT id FROM t", "id", 5, 2.0)
    assert (
        build_config(varied(("schedules.nightly", NIGHTLY))).schedules["nightly"].for_each is None
    )


def test_a_fan_out_needs_a_query_and_a_key() -> None:
    issues = lint_data(varied(("schedules.nightly", {**NIGHTLY, "forEach": {"key": "id"}})))
    assert [(issue.path, issue.message) for issue in issues] == [
        ("schedules.nightly.forEach.query", "`query` is required here")
    ]


def test_the_schemas_fan_out_defaults_are_the_models() -> None:
    for_each = load_schema()["$defs"]["schedule"]["properties"]["forEach"]["properties"]
    assert for_each["maxRows"]["default"] == DEFAULT_FOR_EACH_MAX_ROWS
    assert parse_duration(for_each["timeout"]["default"]) == DEFAULT_FOR_EACH_TIMEOUT
