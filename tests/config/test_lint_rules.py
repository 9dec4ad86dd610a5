"""Every lint rule: at least one failing and one passing case, checked by path, code and message."""

from __future__ import annotations

from typing import Any

import pytest

from sp00ky_infra.config.loader import lint_document as lint
from sp00ky_infra.config.loader import parse_document
from sp00ky_infra.config.rules import RULES
from sp00ky_infra.config.schema import load_schema
from tests.config.test_schedules_config import SCHEDULE_FAILING, SCHEDULE_PASSING
from tests.configs import BASE, DELETE, errors, lint_data, varied

SECOND_BACKEND = {
    "type": "backend",
    "runOn": {"pool": "render"},
    "spec": "./backend/openapi.yml",
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
        "SP109",
        (("apps.renderer.baseUrl", "http://127.0.0.1:8080"),),
        "apps.renderer.baseUrl",
        "`baseUrl` is allowed by the docs but ignored on a pool backend: the agent calls the "
        "backend on 127.0.0.1 at `deploy.port`",
    ),
    (
        "SP140",
        (("apps.renderer.env", {"PORT": "9000"}),),
        "apps.renderer.env.PORT",
        "PORT is set by the machine itself; use another name",
    ),
    (
        "SP140",
        (("apps.renderer.env", {"SPKY_AGENT_MACHINE": {"fromEnv": "X"}}),),
        "apps.renderer.env.SPKY_AGENT_MACHINE",
        "SPKY_AGENT_MACHINE is set by the machine itself",
    ),
    (
        "SP141",
        (("apps.renderer.env", {"SIGNING_KEY": {"vault": "secret/data/render#key"}}),),
        "apps.renderer.env.SIGNING_KEY.vault",
        "vault references are not supported yet; put the secret in the controller's environment",
    ),
    (
        "SP142",
        (("apps.renderer.env", {"API_TOKEN": "tok-123"}),),
        "apps.renderer.env.API_TOKEN",
        "API_TOKEN looks like a secret written in sp00ky.yml; use {fromEnv: API_TOKEN}",
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
    (
        "SP123",
        (("pools.render.queueTimeout", "0s"),),
        "pools.render.queueTimeout",
        "queueTimeout is '0s', but a job must be able to wait for a slot",
    ),
    (
        "SP123",
        (("pools.render.queueTimeout", -1),),
        "pools.render.queueTimeout",
        "give a positive number of seconds (1800) or a duration (30m)",
    ),
    (
        "SP124",
        (("pools.render.idleTimeout", "0s"),),
        "pools.render.idleTimeout",
        "idleTimeout 0s drains a machine above min and buffer at the first tick it has no job "
        "(on Hetzner, once its paid hour is nearly over: keepPaidHours)",
    ),
    (
        "SP124",
        (("pools.render.provider", "docker"), ("pools.render.idleTimeout", "0m")),
        "pools.render.idleTimeout",
        "idleTimeout 0m drains a machine above min and buffer at the first tick it has no job, "
        "so a job that comes later waits for a boot; give it the gap between jobs",
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
        "SP135",
        (("pools.render.machine.type", "cx24"),),
        "pools.render.machine.type",
        "'cx24' is not a Hetzner Cloud server type known here",
    ),
    (
        "SP135",
        (("pools.render.machine.types", ["cpx42", "cpx43"]),),
        "pools.render.machine.types[1]",
        "the closest current ones: cpx42",
    ),
    (
        "SP136",
        (("pools.render.machine.type", "cx22"),),
        "pools.render.machine.type",
        "'cx22' is deprecated by Hetzner (no longer sold to new servers); use cx23; no price "
        "is known for it, so its cost shows as unknown: give one under `prices:`",
    ),
    (
        "SP136",
        (
            ("pools.render.machine.types", ["cx42"]),
            ("prices", {"cx42": {"hourly": 0.02, "monthly": 12}}),
        ),
        "pools.render.machine.types[0]",
        "'cx42' is deprecated by Hetzner (no longer sold to new servers); use cx43",
    ),
    (
        "SP137",
        (
            ("pools.render.machine.types", ["ccx23"]),
            ("pools.render.machine.locations", ["fsn1", "ash"]),
        ),
        "pools.render.machine.locations[1]",
        "'ash' does not sell cx33 (sold in fsn1, nbg1, hel1); a machine of that type cannot be "
        "made there",
    ),
    (
        "SP138",
        (("pools.render.machine.image", "Debian 12"),),
        "pools.render.machine.image",
        "'Debian 12' is not an image a Hetzner server can boot; give an image name (docker-ce, "
        "debian-12), a snapshot id (its digits) or a label selector of snapshots "
        "(sp00ky/agent=abc,os=debian: the newest one that matches)",
    ),
    (
        "SP138",
        (("pools.render.machine.image", "sp00ky/agent=abc,=debian"),),
        "pools.render.machine.image",
        "'sp00ky/agent=abc,=debian' is not an image a Hetzner server can boot ('=debian' does "
        "not start with a label key such as sp00ky/agent); give an image name",
    ),
    (
        "SP139",
        (("pools.render.machine.image", "debian-12"),),
        "pools.render.machine.image",
        "image 'debian-12' has no Docker: each machine installs docker.io with apt at boot "
        "before its agent starts, about 30 s more on Hetzner (assumed); use docker-ce (the "
        "default) or a snapshot with Docker",
    ),
    (
        "SP150",
        (("pools.render.provider", "docker"), ("pools.render.machine.image", "baked")),
        "pools.render.machine.image",
        "`baked` is a Hetzner snapshot the controller makes for the pool, but pool 'render' has "
        "provider 'docker', whose machines boot no image of it; remove machine.image, or give "
        "the pool `provider: hetzner`",
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
    (
        "SP170",
        (("workflows", {"nightly": {"steps": []}}),),
        "workflows",
        "`workflows` is not used by sp00ky-infra: the wider platform reads it, and it is "
        "ignored here; keep it if the platform reads this file too",
    ),
    (
        "SP170",
        (("jobs", [{"name": "export", "command": "python export.py", "pool": "warehouse"}]),),
        "jobs",
        "`jobs` is not used by sp00ky-infra: the wider platform reads it",
    ),
    (
        "SP170",
        (("pool", {"render": {"max": 3}}),),
        "pool",
        "`pool` is not used by sp00ky-infra, nor a key the platform documents, so it is "
        "ignored; did you mean 'pools'?",
    ),
    (
        "SP170",
        (("x-anchors", {"common": 1}),),
        "x-anchors",
        "so it is ignored; remove it, or use a key read here: mode, pools, apps, retention, "
        "schedules, prices",
    ),
    (
        "SP172",
        (("apps.renderer.spec", DELETE),),
        "apps.renderer.spec",
        "backend 'renderer' has no `spec`, so its jobs' payloads go unchecked: `run`, schedules "
        "and the admin API write any JSON payload, and only the backend finds a wrong one, on a "
        "machine; give the backend `spec: PATH` (its OpenAPI document, relative to sp00ky.yml)",
    ),
    (
        "SP172",
        (("apps.renderer.spec", ""),),
        "apps.renderer.spec",
        "backend 'renderer' has no `spec`, so its jobs' payloads go unchecked",
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
    ("SP109", (("apps.api", {"type": "backend", "baseUrl": "http://127.0.0.1:8080"}),)),
    (
        "SP140",
        (
            ("apps.renderer.env", {"LOG_LEVEL": "info", "API_TOKEN": {"fromEnv": "TOKEN"}}),
            ("apps.renderer.envFile", ["./render.env", "/etc/sp00ky/render.env"]),
        ),
    ),
    ("SP141", (("apps.renderer.env", {"KEY": {"fromFile": "/run/secrets/key"}}),)),
    ("SP142", (("apps.renderer.env", {"API_TOKEN": {"fromEnv": "API_TOKEN"}, "TOKENS": 3}),)),
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
    ("SP123", (("pools.render.queueTimeout", 1800),)),
    ("SP124", (("pools.render.idleTimeout", "1s"),)),
    ("SP130", (("mode", "cluster"),)),
    ("SP131", (("pools.render.machine.type", "ccx23"), ("pools.render.machine.types", ["cpx42"]))),
    ("SP135", (("pools.render.machine.type", "cx23"), ("pools.render.machine.types", ["ccx63"]))),
    ("SP136", (("pools.render.machine.type", "cpx22"), ("pools.render.machine.types", ["cx53"]))),
    (
        "SP132",
        (
            ("pools.render.machine.type", "ccx33"),  # sold in every location
            ("pools.render.machine.locations", ["fsn1", "nbg1", "hel1", "ash", "hil", "sin"]),
        ),
    ),
    (
        "SP137",
        (
            ("pools.render.machine.type", "cpx42"),
            ("pools.render.machine.types", ["ccx23"]),
            ("pools.render.machine.locations", ["nbg1", "sin"]),
        ),
    ),
    ("SP133", (("pools.render.provider", "docker"),)),
    ("SP134", (("pools.render.recycle", "never"),)),
    (  # every key this project reads, and nothing else
        "SP170",
        (
            ("retention", {"success": "6h"}),
            (
                "schedules",
                {"nightly": {"cron": "0 3 * * *", "backend": "renderer", "route": "/render"}},
            ),
            ("prices", {"cx33": {"hourly": 0.01, "monthly": 6.49}}),
        ),
    ),
    # a backend on no pool runs no job here: its spec is the platform's business
    ("SP172", (("apps.api", {"type": "backend", "method": {"type": "outbox", "table": "t"}}),)),
    ("SP138", (("pools.render.machine.image", "sp00ky/agent=abc,os in (debian, ubuntu)"),)),
    ("SP138", (("pools.render.machine.image", "123456789"),)),
    ("SP139", (("pools.render.machine.image", "docker-ce"),)),
    ("SP150", (("pools.render.machine.image", "baked"),)),  # a Hetzner pool (the default)
    (  # a docker pool's machines are containers: its image is never booted
        "SP139",
        (("pools.render.provider", "docker"), ("pools.render.machine.image", "debian-12")),
    ),
]
FAILING += SCHEDULE_FAILING  # the schedules' rules, kept with their other tests
PASSING += SCHEDULE_PASSING


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
        ("apps.renderer.spec", "SP172", 11),  # missing: the line of its parent
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


# --- the typo corpus: a misspelling of every key of a pool backend ------------------------

# (the key's path under the backend, the misspelling, the issue's path, code and message)
TYPOS: list[tuple[str, str, str, str, str]] = [
    ("spec", "spek", "spek", "SP001", "unknown key 'spek'; did you mean 'spec'?"),
    ("baseUrl", "baseURL", "baseURL", "SP001", "unknown key 'baseURL'; did you mean 'baseUrl'?"),
    (
        "timeoutOverridable",
        "timeoutOveridable",
        "timeoutOveridable",
        "SP001",
        "unknown key 'timeoutOveridable'; did you mean 'timeoutOverridable'?",
    ),
    ("method", "methd", "methd", "SP001", "unknown key 'methd'; did you mean 'method'?"),
    ("method.type", "typ", "method.typ", "SP001", "unknown key 'typ'; did you mean 'type'?"),
    (
        "method.table",
        "tabel",
        "method.tabel",
        "SP001",
        "unknown key 'tabel'; did you mean 'table'?",
    ),
    (
        "method.schema",
        "shema",
        "method.shema",
        "SP001",
        "unknown key 'shema'; did you mean 'schema'?",
    ),
    (
        "method.concurrency",
        "concurency",
        "method.concurency",
        "SP001",
        "unknown key 'concurency'; did you mean 'concurrency'?",
    ),
    (
        "method.maxRetries",
        "maxRetry",
        "method.maxRetry",
        "SP001",
        "unknown key 'maxRetry'; did you mean 'maxRetries'?",
    ),
    (
        "method.retryStrategy",
        "retry_strategy",
        "method.retry_strategy",
        "SP001",
        "unknown key 'retry_strategy'; did you mean 'retryStrategy'?",
    ),
    ("deploy", "deplyo", "deplyo", "SP001", "unknown key 'deplyo'; did you mean 'deploy'?"),
    (
        "deploy.dockerfile",
        "dockerFile",
        "deploy.dockerFile",
        "SP001",
        "unknown key 'dockerFile'; did you mean 'dockerfile'?",
    ),
    (
        "deploy.image",
        "imgae",
        "deploy.imgae",
        "SP001",
        "unknown key 'imgae'; did you mean 'image'?",
    ),
    ("deploy.port", "prot", "deploy.prot", "SP001", "unknown key 'prot'; did you mean 'port'?"),
    (
        "deploy.healthcheck",
        "healthCheck",
        "deploy.healthCheck",
        "SP001",
        "unknown key 'healthCheck'; did you mean 'healthcheck'?",
    ),
    (
        "deploy.command",
        "comand",
        "deploy.comand",
        "SP001",
        "unknown key 'comand'; did you mean 'command'?",
    ),
    (
        "deploy.timeout",
        "timout",
        "deploy.timout",
        "SP001",
        "unknown key 'timout'; did you mean 'timeout'?",
    ),
    ("env", "enviroment", "enviroment", "SP001", "unknown key 'enviroment'; did you mean 'env'?"),
    (
        "env",
        "environment",
        "environment",
        "SP001",
        "unknown key 'environment'; did you mean 'env'?",
    ),
    ("envFile", "env_file", "env_file", "SP001", "unknown key 'env_file'; did you mean 'envFile'?"),
    ("runOn.pool", "pol", "runOn.pol", "SP001", "unknown key 'pol'; did you mean 'pool'?"),
    # Without `runOn` (or `type`) the app is no pool backend, so its keys are not checked; what
    # names the key instead is the pool left without a backend, or the missing type.
    (
        "runOn",
        "runon",
        "pools.render",
        "SP102",
        "pool 'render' is used by no backend; add `runOn: { pool: render }` to the backend "
        "that should run on it, or remove the pool",
    ),
    ("type", "typ", "type", "SP001", "`type` is required here"),
]
SAMPLES: dict[str, Any] = {  # values for the keys BASE does not set
    "baseUrl": "http://127.0.0.1:8080",
    "timeoutOverridable": True,
    "method.schema": "./src/outbox/render.surql",
    "method.concurrency": 2,
    "method.maxRetries": 5,
    "method.retryStrategy": "exponential",
    "deploy.image": "ghcr.io/acme/renderer:1.4",
    "deploy.command": ["python3", "server.py"],
    "deploy.timeout": 60,
    "env": {"RENDER_QUALITY": "high"},
    "envFile": "./render.env",
}


def _pool_backend_keys() -> set[str]:
    """Every key a pool backend may have, dotted, read off the shipped schema."""
    defs = load_schema()["$defs"]
    backend = defs["backend"]["properties"]
    keys = set(backend) | set(defs["poolBackend"].get("properties", {}))
    for block in ("method", "deploy", "runOn"):
        keys |= {f"{block}.{key}" for key in backend[block]["properties"]}
    return keys


def test_the_typo_corpus_covers_every_key_of_a_pool_backend() -> None:
    assert {case[0] for case in TYPOS} == _pool_backend_keys()


@pytest.mark.parametrize(("key", "typo", "path", "code", "message"), TYPOS)
def test_a_misspelled_pool_backend_key_is_named(
    key: str, typo: str, path: str, code: str, message: str
) -> None:
    data = varied(*((f"apps.renderer.{k}", v) for k, v in SAMPLES.items() if k == key))
    *parents, last = key.split(".")
    block = data["apps"]["renderer"]
    for parent in parents:
        block = block[parent]
    block[typo] = block.pop(last)
    issues = lint_data(data)
    where = path if path.startswith("pools.") else f"apps.renderer.{path}"
    assert (where, code, message, "error") in [
        (issue.path, issue.code, issue.message, issue.severity) for issue in issues
    ], issues


def test_keys_of_other_apps_and_env_names_are_not_checked() -> None:
    data = varied(
        ("apps.web", {"type": "frontend", "framework": "solid", "dev": {"port": 3000}}),
        ("apps.api", {"type": "backend", "method": {"type": "http", "retries": 3}, "auth": "x"}),
        ("apps.renderer.env", {"ANY_name-at.all": "1", "N": 2, "B": True}),
    )
    assert lint_data(data) == []
