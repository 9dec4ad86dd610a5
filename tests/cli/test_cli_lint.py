"""`sp00ky-infra lint` as a user runs it: real processes, exit codes, output lines."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from tests.configs import DELETE, varied, with_backend_files
from tests.helpers import ROOT, cli

LINE = re.compile(
    r"^(?P<path>[^\s:]+): (?P<message>.+) \[(?P<code>SP\d{3})\] \(line (?P<line>\d+)\)$"
)


@pytest.mark.parametrize("example", sorted((ROOT / "examples").glob("*.yml")), ids=lambda p: p.name)
def test_every_example_passes(example: Path) -> None:
    done = cli("lint", str(example))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{example}: ok. Checked against the JSON Schema and" in done.stdout


def test_several_problems_print_one_line_each_and_exit_1(tmp_path: Path) -> None:
    path = tmp_path / "sp00ky.yml"
    path.write_text(
        "mode: cluster\n"
        "pools:\n"
        "  render:\n"
        "    machine: { type: cax11 }\n"
        "    autoscale: true\n"
        "    max: 2\n"
        "    buffer: 3\n"
        "    lease: 10s\n"
        "apps:\n"
        "  renderer:\n"
        "    type: backend\n"
        "    runOn: { pool: render }\n"
        "    method: { type: outbox, table: render_job }\n"
        "    deploy: { dockerfile: Dockerfile, healthcheck: /health }\n"
    )
    (tmp_path / "Dockerfile").write_text("FROM python:3.12-slim\n")
    done = cli("lint", str(path))
    assert done.returncode == 1
    parsed = [LINE.match(line) for line in done.stdout.splitlines()]
    assert all(parsed), done.stdout
    assert [(m["path"], m["code"], int(m["line"])) for m in parsed if m] == [
        ("pools.render.machine.type", "SP131", 4),
        ("pools.render.buffer", "SP112", 7),
        ("pools.render.lease", "SP121", 8),
        ("apps.renderer.spec", "SP172", 10),  # a warning: not one of the problems counted
        ("apps.renderer.deploy.port", "SP105", 14),
    ]
    assert f"{path}: 4 problem(s)" in done.stderr


def test_json_output(tmp_path: Path) -> None:
    path = with_backend_files(tmp_path) / "pools.yml"
    path.write_text(yaml.safe_dump(varied(("pools.render.min", 7))))
    done = cli("lint", str(path), "--json")
    assert done.returncode == 1
    (issue,) = json.loads(done.stdout)
    assert issue["path"] == "pools.render.min" and issue["code"] == "SP111"
    assert issue["message"] == "min (7) is above max (2); lower min or raise max"
    assert isinstance(issue["line"], int) and issue["severity"] == "error"


def test_warnings_alone_exit_0(tmp_path: Path) -> None:
    path = with_backend_files(tmp_path) / "sp00ky.yml"
    path.write_text(yaml.safe_dump(varied(("apps.renderer.deploy.healthcheck", DELETE))))
    done = cli("lint", str(path))
    assert done.returncode == 0
    assert "apps.renderer.deploy.healthcheck: warning: backend 'renderer' has no" in done.stdout
    assert "1 warning(s)" in done.stdout


def test_default_file_is_sp00ky_yml_in_the_working_directory(tmp_path: Path) -> None:
    (with_backend_files(tmp_path) / "sp00ky.yml").write_text(yaml.safe_dump(varied()))
    assert cli("lint", cwd=tmp_path, env={"SPKY_CONFIG": ""}).returncode == 0
    missing = cli("lint", cwd=tmp_path / "..", env={"SPKY_CONFIG": ""})
    assert missing.returncode == 2
    assert "sp00ky.yml: no such file" in missing.stderr


def test_spky_config_is_the_default_when_set(tmp_path: Path) -> None:
    path = tmp_path / "elsewhere.yml"
    path.write_text(yaml.safe_dump(varied(("pools.render.slots", 0))))
    done = cli("lint", env={"SPKY_CONFIG": str(path)})
    assert done.returncode == 1 and "pools.render.slots: slots is 0" in done.stdout


def test_unreadable_file_exits_2(tmp_path: Path) -> None:
    done = cli("lint", str(tmp_path / "missing.yml"))
    assert done.returncode == 2
    assert f"error: {tmp_path / 'missing.yml'}: no such file" in done.stderr
    assert cli("lint", str(tmp_path)).returncode == 2


def test_malformed_yaml_reports_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "sp00ky.yml"
    path.write_text("mode: cluster\npools:\n  render:\n    min: [1, 2\n    max: 3\n")
    done = cli("lint", str(path))
    assert done.returncode == 2
    assert re.search(r"not valid YAML: .* \(line 5, column 8\)", done.stderr), done.stderr


def test_not_utf8_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "sp00ky.yml"
    path.write_bytes(b"mode: \xff\xfe\n")
    done = cli("lint", str(path))
    assert done.returncode == 2 and "cannot be read" in done.stderr


def test_schema_command_prints_the_schema() -> None:
    done = cli("schema")
    assert done.returncode == 0
    assert json.loads(done.stdout)["$schema"].endswith("2020-12/schema")


def test_typos_under_apps_are_named_with_the_key_meant(tmp_path: Path) -> None:
    path = tmp_path / "sp00ky.yml"
    path.write_text(
        "mode: cluster\n"
        "pools:\n"
        "  render: { min: 0, autoscale: true, max: 2 }\n"
        "apps:\n"
        "  web: { type: frontend, framework: solid }\n"
        "  renderer:\n"
        "    type: backend\n"
        "    runOn: { pool: render }\n"
        "    baseUrl: http://127.0.0.1:8080\n"
        "    method: { type: outbox, table: render_job, concurency: 2 }\n"
        "    enviroment: { A: b }\n"
        "    deploy:\n"
        "      dockerfile: Dockerfile\n"
        "      port: 8080\n"
        "      healthCheck: /health\n"
        "      helthcheck_interval: 5\n"
    )
    (tmp_path / "Dockerfile").write_text("FROM python:3.12-slim\n")
    done = cli("lint", str(path))
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        "apps.renderer.spec: warning: backend 'renderer' has no `spec`, so its jobs' payloads go "
        "unchecked: `run`, schedules and the admin API write any JSON payload, and only the "
        "backend finds a wrong one, on a machine; give the backend `spec: PATH` (its OpenAPI "
        "document, relative to sp00ky.yml) so that a payload is checked before its job is "
        "written [SP172] (line 6)",
        "apps.renderer.baseUrl: warning: `baseUrl` is allowed by the docs but ignored on a pool "
        "backend: the agent calls the backend on 127.0.0.1 at `deploy.port` [SP109] (line 9)",
        "apps.renderer.method.concurency: unknown key 'concurency'; did you mean 'concurrency'? "
        "[SP001] (line 10)",
        "apps.renderer.enviroment: unknown key 'enviroment'; did you mean 'env'? [SP001] (line 11)",
        "apps.renderer.deploy.healthCheck: unknown key 'healthCheck'; did you mean "
        "'healthcheck'? [SP001] (line 15)",
        "apps.renderer.deploy.helthcheck_interval: unknown key 'helthcheck_interval'; did you "
        "mean 'healthcheck'? [SP001] (line 16)",
    ]
    assert f"{path}: 4 problem(s)" in done.stderr
    as_json = cli("lint", str(path), "--json")
    assert as_json.returncode == 1
    issues = json.loads(as_json.stdout)
    assert {tuple(sorted(issue)) for issue in issues} == {
        ("code", "line", "message", "path", "severity")
    }
    assert [(i["path"], i["severity"]) for i in issues][:4] == [
        ("apps.renderer.spec", "warning"),
        ("apps.renderer.baseUrl", "warning"),
        ("apps.renderer.method.concurency", "error"),
        ("apps.renderer.enviroment", "error"),
    ]


def test_keys_this_project_does_not_read_are_warnings_and_exit_0(tmp_path: Path) -> None:
    path = with_backend_files(tmp_path) / "sp00ky.yml"
    path.write_text(
        (ROOT / "examples" / "sp00ky.yml").read_text()
        + "state:\n  path: ./state\njobs:\n  - name: export\n    command: python export.py\n"
    )
    lines = len((ROOT / "examples" / "sp00ky.yml").read_text().splitlines())
    done = cli("lint", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        f"state: warning: `state` is not used by sp00ky-infra: the wider platform reads it, and "
        f"it is ignored here; keep it if the platform reads this file too [SP170] "
        f"(line {lines + 1})"
    ) in done.stdout.splitlines()
    assert "jobs: warning: `jobs` is not used by sp00ky-infra" in done.stdout
    assert "4 warning(s)" in done.stdout  # with the example's two SP109 warnings
    as_json = cli("lint", str(path), "--json")
    assert as_json.returncode == 0
    ours = [i for i in json.loads(as_json.stdout) if i["code"] == "SP170"]
    assert [(i["path"], i["line"], i["severity"]) for i in ours] == [
        ("state", lines + 1, "warning"),
        ("jobs", lines + 3, "warning"),
    ]


def test_a_pool_backend_without_a_spec_is_a_warning_and_exits_0(tmp_path: Path) -> None:
    path = with_backend_files(tmp_path) / "sp00ky.yml"
    path.write_text(yaml.safe_dump(varied(("apps.renderer.spec", DELETE))))
    done = cli("lint", str(path), "--json")
    assert done.returncode == 0
    (issue,) = json.loads(done.stdout)
    assert (issue["path"], issue["code"], issue["severity"]) == (
        "apps.renderer.spec",
        "SP172",
        "warning",
    )
    assert "its jobs' payloads go unchecked" in issue["message"]


def test_a_file_a_pool_backend_names_that_is_not_there_is_a_problem_and_exits_1(
    tmp_path: Path,
) -> None:
    path = tmp_path / "sp00ky.yml"
    text = yaml.safe_dump(varied(), sort_keys=False)  # names ./backend/openapi.yml, Dockerfile
    path.write_text(text)
    spec, dockerfile = (
        1 + next(n for n, line in enumerate(text.splitlines()) if line.strip().startswith(key))
        for key in ("spec:", "dockerfile:")
    )
    done = cli("lint", str(path))
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        f"apps.renderer.spec: `spec` names './backend/openapi.yml', but there is no file at "
        f"{tmp_path}/backend/openapi.yml (a relative path starts at the directory of "
        f"sp00ky.yml, {tmp_path}); fix the path, or add the file there [SP171] (line {spec})",
        f"apps.renderer.deploy.dockerfile: `deploy.dockerfile` names './backend/Dockerfile', "
        f"but there is no file at {tmp_path}/backend/Dockerfile (a relative path starts at the "
        f"directory of sp00ky.yml, {tmp_path}); fix the path, or add the file there [SP171] "
        f"(line {dockerfile})",
    ]
    assert f"{path}: 2 problem(s)" in done.stderr
    as_json = cli("lint", str(path), "--json")
    assert as_json.returncode == 1
    assert {(i["code"], i["severity"]) for i in json.loads(as_json.stdout)} == {("SP171", "error")}
    with_backend_files(tmp_path)
    assert cli("lint", str(path)).returncode == 0
