"""The shipped JSON Schema: valid draft 2020-12, its errors explained, its defaults the model's."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from jsonschema import Draft202012Validator

from sp00ky_infra.config import model
from sp00ky_infra.config.durations import parse_duration
from sp00ky_infra.config.schema import SCHEMA_CODE, load_schema
from tests.configs import lint_data, varied

EXAMPLES = sorted(Path(__file__).parents[2].joinpath("examples").glob("*.yml"))


def test_schema_is_draft_2020_12() -> None:
    schema = load_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_examples_validate_against_the_schema(example: Path) -> None:
    errors = list(
        Draft202012Validator(load_schema()).iter_errors(yaml.safe_load(example.read_text()))
    )
    assert errors == []


def _schema_issues(*changes: tuple[str, object]) -> list[tuple[str, str]]:
    return [(i.path, i.message) for i in lint_data(varied(*changes)) if i.code == SCHEMA_CODE]


def test_unknown_key_suggests_the_close_one() -> None:
    assert _schema_issues(("pools.render.idleTimout", "5m")) == [
        ("pools.render.idleTimout", "unknown key 'idleTimout'; did you mean 'idleTimeout'?")
    ]


def test_wrong_type_names_both_types() -> None:
    assert _schema_issues(("pools.render.max", "two")) == [
        ("pools.render.max", "must be a whole number, not a string")
    ]


def test_enum_lists_the_choices() -> None:
    assert _schema_issues(("mode", "clustr")) == []  # SP130 says more about the same place
    assert _schema_issues(("apps.renderer.type", "backend"), ("retention", {"maxRows": -1})) == [
        ("retention.maxRows", "must be at least 0 (it is -1)")
    ]


def test_run_on_needs_a_pool() -> None:
    assert _schema_issues(("apps.renderer.runOn", {})) == [
        ("apps.renderer.runOn.pool", "`pool` is required here")
    ]


def test_command_is_a_string_or_list_of_strings() -> None:
    assert _schema_issues(("apps.renderer.deploy.command", [1, 2])) == [
        ("apps.renderer.deploy.command", "must be a command line (one string) or a list of strings")
    ]


def test_pool_names_are_checked() -> None:
    issues = _schema_issues(("pools.Render_1", {"min": 1}))
    assert (
        "pools.Render_1",
        "name 'Render_1' must be lowercase letters, digits and dashes, "
        "start with a letter, and be at most 40 characters",
    ) in issues


def _pool_schema() -> dict[str, object]:
    pool: dict[str, object] = load_schema()["$defs"]["pool"]["properties"]
    return pool


@pytest.mark.parametrize(
    ("key", "field", "convert"),
    [
        ("slots", "slots", None),
        ("min", "min", None),
        ("buffer", "buffer", None),
        ("autoscale", "autoscale", None),
        ("recycle", "recycle", None),
        ("provider", "provider", None),
        ("maxQueued", "max_queued", None),
        ("lease", "lease", "duration"),
        ("idleTimeout", "idle_timeout", "duration"),
        ("maxJobDuration", "max_job_duration", "duration"),
        ("maxLifetime", "max_lifetime", "duration"),
        ("bootTimeout", "boot_timeout", "duration"),
        ("queueTimeout", "queue_timeout", "duration"),
    ],
)
def test_schema_defaults_are_the_model_defaults(key: str, field: str, convert: str | None) -> None:
    default = _pool_schema()[key]["default"]  # type: ignore[index]
    expected = parse_duration(default) if convert == "duration" else default
    assert getattr(model.Pool(name="p"), field) == expected


def test_machine_and_retention_defaults_agree() -> None:
    schema = load_schema()["$defs"]
    assert (
        schema["pool"]["properties"]["machine"]["properties"]["type"]["default"]
        == model.MachineShape().type
        == "cx33"
    )
    assert (
        schema["pool"]["properties"]["machine"]["properties"]["image"]["default"]
        == model.MachineShape().image
        == "docker-ce"
    )
    retention = schema["retention"]["properties"]
    built = model.Retention()
    assert parse_duration(retention["success"]["default"]) == built.success == 6 * 3600
    assert parse_duration(retention["failed"]["default"]) == built.failed == 14 * 86400
    assert retention["maxRows"]["default"] == built.max_rows == 0


def test_pool_backend_typos_get_the_pools_hint_and_values_are_reported_once() -> None:
    assert _schema_issues(("apps.renderer.deploy.prot", 8080)) == [
        ("apps.renderer.deploy.prot", "unknown key 'prot'; did you mean 'port'?")
    ]
    # method and deploy are checked by the backend's schema and the closed pool backend's
    assert _schema_issues(("apps.renderer.method.concurrency", 0)) == [
        ("apps.renderer.method.concurrency", "must be at least 1 (it is 0)")
    ]


def test_a_backend_without_run_on_keeps_keys_this_project_does_not_know() -> None:
    assert (
        _schema_issues(("apps.api", {"type": "backend", "replicas": 2, "deploy": {"cpu": 1}})) == []
    )
