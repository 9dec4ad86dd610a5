"""Every lint rule: at least one failing and one passing case, checked by path, code and message."""

from __future__ import annotations

from typing import Any

import pytest

from sp00ky_infra.config.loader import lint_document as lint
from sp00ky_infra.config.loader import parse_document
from sp00ky_infra.config.rules import RULES
from tests.configs import BASE, DELETE, errors, lint_data, varied

SECOND_BACKEND = {
    "type": "backend",
    "runOn": {"pool": "render"},
    "method": {"type": "outbox", "table": "other_job"},
    "deploy": {"dockerfile": "./Dockerfile", "port": 8080, "healthcheck": "/health"},
}

# (code, changes, path, words the message must contain)
FAILING: list[tuple[str, tuple[tuple[str, Any], ...], str, str]] = [
    (
        "SP101",
        (("apps.renderer.runOn.pool", "rendr"),),
        "apps.renderer.runOn.pool",
        "runs on pool 'rendr', which is not declared under pools (declared: render)",
    ),
    (
        "SP102",
        (("pools.spare", {"min": 1}),),
        "pools.spare",
        "pool 'spare' is used by no backend; add `runOn: { pool: spare }`",
    ),
    (
        "SP103",
        (("apps.second", SECOND_BACKEND),),
        "apps.second.runOn.pool",
        "pool 'render' is already used by backend 'renderer'; a machine runs exactly one backend",
    ),
    (
        "SP104",
        (("apps.renderer.method.type", "http"),),
        "apps.renderer.method.type",
        "needs `method: { type: outbox }`",
    ),
    (
        "SP104",
        (("apps.renderer.method.table", DELETE),),
        "apps.renderer.method.table",
        "its outbox method needs a `table`",
    ),
    (
        "SP105",
        (("apps.renderer.deploy.port", DELETE),),
        "apps.renderer.deploy.port",
        "needs `deploy.port`: the port the agent sends jobs to",
    ),
    (
        "SP106",
        (("apps.renderer.deploy.dockerfile", DELETE),),
        "apps.renderer.deploy.dockerfile",
        "needs `deploy.image` (from a registry, REGISTRY/NAME:TAG) or `deploy.dockerfile` "
        "(built by the controller): the image each machine runs",
    ),
    (
        "SP108",
        (("apps.renderer.deploy.image", "ghcr.io/acme/renderer"),),
        "apps.renderer.deploy.image",
        "'ghcr.io/acme/renderer' is not an image reference: it has neither a tag nor a digest; "
        "pin one (no implicit latest); write REGISTRY/NAME:TAG or REGISTRY/NAME@sha256:DIGEST",
    ),
    (
        "SP108",
        (("apps.renderer.deploy.image", "ghcr.io/Acme/renderer:1"),),
        "apps.renderer.deploy.image",
        "name 'Acme/renderer' is not valid (lowercase letters, digits and . _ - between /)",
    ),
    (
        "SP108",
        (("apps.renderer.deploy.image", "ghcr.io/acme/renderer@sha256:abc"),),
        "apps.renderer.deploy.image",
        "digest 'sha256:abc' is not sha256: and 64 lowercase hex",
    ),
    (
        "SP107",
        (("apps.renderer.deploy.healthcheck", DELETE),),
        "apps.renderer.deploy.healthcheck",
        "will count as ready as soon as its port accepts connections",
    ),
    (
        "SP110",
        (("pools.render.max", DELETE),),
        "pools.render.max",
        "pool 'render' autoscales, so it needs `max` (at least 1)",
    ),
    (
        "SP110",
        (("pools.render.max", 0),),
        "pools.render.max",
        "max is 0, but an autoscaling pool needs max of at least 1",
    ),
    ("SP111", (("pools.render.min", 3),), "pools.render.min", "min (3) is above max (2)"),
    ("SP112", (("pools.render.buffer", 3),), "pools.render.buffer", "buffer (3) is above max (2)"),
    (
        "SP113",
        (("pools.render.autoscale", False), ("pools.render.max", DELETE)),
        "pools.render.min",
        "fixed (no autoscale), so it always runs exactly `min` machines and min must be at least 1",
    ),
    (
        "SP114",
        (("pools.render.autoscale", DELETE), ("pools.render.min", 1)),
        "pools.render.max",
        "fixed (no autoscale), so `max` has no effect; remove it",
    ),
    (
        "SP114",
        (
            ("pools.render.autoscale", False),
            ("pools.render.min", 1),
            ("pools.render.max", DELETE),
            ("pools.render.buffer", 1),
        ),
        "pools.render.buffer",
        "fixed (no autoscale), so `buffer` has no effect",
    ),
    (
        "SP115",
        (("pools.render.slots", 0),),
        "pools.render.slots",
        "slots is 0; a machine runs at least 1 job at a time",
    ),
    (
        "SP120",
        (("pools.render.idleTimeout", "5 min"),),
        "pools.render.idleTimeout",
        "'5 min' is not a duration; write it like 90s, 10m, 1h30m or 8h",
    ),
    ("SP120", (("pools.render.lease", "90"),), "pools.render.lease", "add a unit: 90s"),
    (
        "SP120",
        (("retention", {"failed": "two weeks"}),),
        "retention.failed",
        "'two weeks' is not a duration",
    ),
    (
        "SP121",
        (("pools.render.lease", "10s"),),
        "pools.render.lease",
        "lease is 10s; it must be at least 30s",
    ),
    (
        "SP122",
        (("pools.render.maxLifetime", "1h"),),
        "pools.render.maxLifetime",
        "maxLifetime (1h) is shorter than maxJobDuration (8h)",
    ),
    (
        "SP122",
        (("pools.render.maxJobDuration", "2d"),),
        "pools.render.maxLifetime",
        "maxLifetime (24h) is shorter than maxJobDuration (2d)",
    ),
    ("SP130", (("mode", "single"),), "mode", "needs `mode: cluster` (mode is 'single')"),
    ("SP130", (("mode", DELETE),), "mode", "(mode is 'unset')"),
    (
        "SP131",
        (("pools.render.machine.type", "cax21"),),
        "pools.render.machine.type",
        "'cax21' is an Arm (CAX) server type; the backend image is built for linux/amd64",
    ),
    (
        "SP131",
        (("pools.render.machine.type", "m5.large"),),
        "pools.render.machine.type",
        "'m5.large' is not a Hetzner Cloud x86 server type",
    ),
    (
        "SP131",
        (("pools.render.machine.types", ["cpx42", "cax41"]),),
        "pools.render.machine.types[1]",
        "'cax41' is an Arm (CAX) server type",
    ),
    (
        "SP132",
        (("pools.render.machine.locations", ["fsn1", "us-east"]),),
        "pools.render.machine.locations[1]",
        "'us-east' is not a Hetzner location; use one of fsn1, nbg1, hel1, ash, hil, sin",
    ),
    (
        "SP133",
        (("pools.render.provider", "aws"),),
        "pools.render.provider",
        "provider 'aws' is not supported; use `hetzner`",
    ),
    (
        "SP134",
        (("pools.render.recycle", "always"),),
        "pools.render.recycle",
        "recycle 'always' is not known; use `job`",
    ),
]

# (code, changes) that are valid: the rule must stay quiet and nothing else may fail either.
PASSING: list[tuple[str, tuple[tuple[str, Any], ...]]] = [
    ("SP101", ()),
    ("SP102", ()),
    (
        "SP103",
        (
            ("apps.second", {**SECOND_BACKEND, "runOn": {"pool": "other"}}),
            ("pools.other", {"min": 1}),
        ),
    ),
    ("SP104", (("apps.renderer.method", {"type": "outbox", "table": "t", "concurrency": 4}),)),
    ("SP105", (("apps.renderer.deploy.port", 1),)),
    ("SP106", (("apps.renderer.deploy.dockerfile", "Dockerfile"),)),
    (
        "SP106",
        (
            ("apps.renderer.deploy.dockerfile", DELETE),
            ("apps.renderer.deploy.image", "127.0.0.1:5000/acme/renderer:1.4"),
        ),
    ),
    ("SP108", (("apps.renderer.deploy.image", "python:3.12"),)),
    ("SP108", (("apps.renderer.deploy.image", "ghcr.io/acme/r@sha256:" + "a" * 64),)),
    ("SP107", (("apps.renderer.deploy.healthcheck", "/ready"),)),
    ("SP110", (("pools.render.max", 1),)),
    ("SP111", (("pools.render.min", 2),)),
    ("SP112", (("pools.render.buffer", 2),)),
    (
        "SP113",
        (("pools.render.autoscale", False), ("pools.render.max", DELETE), ("pools.render.min", 1)),
    ),
    (
        "SP114",
        (("pools.render.autoscale", DELETE), ("pools.render.max", DELETE), ("pools.render.min", 2)),
    ),
    ("SP115", (("pools.render.slots", 4),)),
    (
        "SP120",
        (
            ("pools.render.idleTimeout", "1h30m"),
            (
                "retention",
                {"success": "90s", "failed": "14d", "runSuccess": "24h", "runFailed": "1d12h"},
            ),
        ),
    ),
    ("SP121", (("pools.render.lease", "30s"),)),
    ("SP122", (("pools.render.maxLifetime", "8h"),)),
    ("SP130", (("mode", "cluster"),)),
    ("SP131", (("pools.render.machine.type", "ccx23"), ("pools.render.machine.types", ["cpx42"]))),
    ("SP132", (("pools.render.machine.locations", ["fsn1", "nbg1", "hel1", "ash", "hil", "sin"]),)),
    ("SP133", (("pools.render.provider", "docker"),)),
    ("SP134", (("pools.render.recycle", "never"),)),
]


@pytest.mark.parametrize(("code", "changes", "path", "words"), FAILING)
def test_rule_fails(code: str, changes: tuple[tuple[str, Any], ...], path: str, words: str) -> None:
    issues = lint_data(varied(*changes))
    mine = [issue for issue in issues if issue.code == code]
    assert [issue.path for issue in mine] == [path], issues
    assert words in mine[0].message
    # one problem, one report: the schema does not repeat what a rule said about the same place
    assert [issue.path for issue in issues].count(path) == 1, issues


@pytest.mark.parametrize(("code", "changes"), PASSING)
def test_rule_passes(code: str, changes: tuple[tuple[str, Any], ...]) -> None:
    issues = lint_data(varied(*changes))
    assert issues == []


def test_every_rule_has_a_failing_and_a_passing_case() -> None:
    codes = {each.code for each in RULES}
    assert codes == {case[0] for case in FAILING}
    assert codes == {case[0] for case in PASSING}
    assert len(codes) == len(RULES), "rule codes are unique"


def test_base_config_is_valid() -> None:
    assert lint_data(BASE) == []


def test_healthcheck_is_a_warning_not_an_error() -> None:
    issues = lint_data(varied(("apps.renderer.deploy.healthcheck", DELETE)))
    assert [issue.severity for issue in issues] == ["warning"]
    assert errors(issues) == []


def test_problems_carry_the_yaml_line_of_their_path() -> None:
    text = """\
mode: cluster
pools:
  render:
    min: 3
    autoscale: true
    max: 2
    lease: 5s
    machine:
      locations: [fsn1, moon]
apps:
  renderer:
    type: backend
    runOn: { pool: render }
    method: { type: outbox, table: render_job }
    deploy: { dockerfile: Dockerfile, healthcheck: /health }
"""
    found = {(issue.path, issue.code, issue.line) for issue in lint(parse_document(text))}
    assert found == {
        ("pools.render.min", "SP111", 4),
        ("pools.render.lease", "SP121", 7),
        ("pools.render.machine.locations[1]", "SP132", 9),
        ("apps.renderer.deploy.port", "SP105", 15),  # missing: the line of its parent
    }


def test_a_missing_pool_section_and_apps_are_fine() -> None:
    assert lint(parse_document("mode: single\n")) == []
    assert lint(parse_document("")) == []


def test_apps_of_other_types_are_not_checked() -> None:
    data = varied(("apps.web", {"type": "frontend", "anything": [1, 2]}))
    assert lint_data(data) == []


def test_all_problems_reported_at_once() -> None:
    data = varied(
        ("pools.render.min", 5),
        ("pools.render.slots", 0),
        ("pools.render.provider", "gcp"),
        ("apps.renderer.deploy.port", DELETE),
        ("mode", "single"),
    )
    codes = sorted(issue.code for issue in lint_data(data))
    assert codes == ["SP105", "SP111", "SP115", "SP130", "SP133"]


def test_base_is_not_mutated_by_varied() -> None:
    varied(("pools.render.max", 9))
    assert BASE["pools"]["render"]["max"] == 2
