"""sp00ky.yml is shared with the wider platform: what this project does not read is named once
(SP170), the files a pool backend names are checked where the controller looks for them
(SP171, config/files.py), and a pool backend without a spec is named (SP172)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sp00ky_infra.config import Issue
from sp00ky_infra.config.document import DUPLICATE_KEY_CODE
from sp00ky_infra.config.files import FILE_CODE
from sp00ky_infra.config.loader import lint_file, load_config
from sp00ky_infra.config.model import build_config
from sp00ky_infra.config.routes import ROUTE_CODE
from sp00ky_infra.config.rules import PLATFORM_KEYS, READ_KEYS, RULES
from sp00ky_infra.config.schema import SCHEMA_CODE, load_schema
from tests.configs import BASE, varied, with_backend_files
from tests.helpers import ROOT

EXAMPLES = ROOT / "examples"

# --- SP170: top-level keys ------------------------------------------------------------------


def test_the_keys_read_and_the_platform_keys_are_the_schema_s_top_level_keys() -> None:
    properties = list(load_schema()["properties"])
    assert sorted(properties) == sorted((*READ_KEYS, *PLATFORM_KEYS))
    assert not set(READ_KEYS) & set(PLATFORM_KEYS)


def test_the_keys_read_are_the_ones_the_typed_config_is_built_from() -> None:
    """Each key the rule calls read changes the typed config, and a platform key does not (so
    no key is called read while it is ignored, nor ignored while it is read)."""
    plain = build_config(BASE)
    other = {
        "mode": "single",
        "pools": {},
        "apps": {},
        "retention": {"success": "1h"},
        "schedules": {"n": {"cron": "0 3 * * *", "backend": "renderer", "route": "/render"}},
        "prices": {"cx33": {"hourly": 1, "monthly": 2}},
    }
    assert sorted(other) == sorted(READ_KEYS)
    for key, value in other.items():
        assert build_config({**BASE, key: value}) != plain, key
    for key in PLATFORM_KEYS:
        assert build_config({**BASE, key: {"anything": 1}}) == plain, key


def _write(folder: Path, text: str) -> Path:
    path = with_backend_files(folder) / "sp00ky.yml"
    path.write_text(yaml.safe_dump(BASE, sort_keys=False) + text)
    return path


def test_each_key_not_read_is_named_once_with_its_line(tmp_path: Path) -> None:
    lines = len(yaml.safe_dump(BASE, sort_keys=False).splitlines())
    path = _write(
        tmp_path,
        "state:\n"
        "  path: ./state\n"
        "jobs:\n"
        "  - name: export\n"
        "    command: python export.py\n"
        "    pool: warehouse\n"
        "  - name: import\n"
        "    command: python import.py\n"
        "workflows:\n"
        "  nightly: { steps: [a, b] }\n"
        "  weekly: { steps: [c] }\n"
        "slug: acme-render\n"
        "pool: {}\n",
    )
    issues = lint_file(path)
    assert [(i.path, i.code, i.line, i.severity) for i in issues] == [
        ("state", "SP170", lines + 1, "warning"),
        ("jobs", "SP170", lines + 3, "warning"),
        ("workflows", "SP170", lines + 9, "warning"),
        ("slug", "SP170", lines + 12, "warning"),
        ("pool", "SP170", lines + 13, "warning"),
    ]
    assert issues[1].message == (
        "`jobs` is not used by sp00ky-infra: the wider platform reads it, and it is ignored "
        "here; keep it if the platform reads this file too"
    )
    assert issues[-1].message == (
        "`pool` is not used by sp00ky-infra, nor a key the platform documents, so it is "
        "ignored; did you mean 'pools'?"
    )


def test_a_key_written_twice_is_one_error_and_one_warning(tmp_path: Path) -> None:
    path = _write(tmp_path, "jobs: []\nworkflows: {}\njobs: [{name: export}]\n")
    issues = lint_file(path)
    assert sorted((i.path, i.code, i.severity) for i in issues) == [
        ("jobs", DUPLICATE_KEY_CODE, "error"),
        ("jobs", "SP170", "warning"),
        ("workflows", "SP170", "warning"),
    ]


def test_no_key_of_a_platform_section_is_named_by_anything_else(tmp_path: Path) -> None:
    """The platform's sections have their own shapes (`pools` there has no runOn): only the
    one warning speaks of them, nothing below them is checked."""
    path = _write(
        tmp_path,
        "state: { path: ./state, lock: true }\n"
        "jobs: [{name: export, pool: warehouse, poolSlots: 2, queueTimeout: 1800}]\n"
        "workflows: {nightly: {tasks: {a: {command: x}}}}\n",
    )
    issues = lint_file(path)
    assert [(i.path, i.code) for i in issues] == [
        ("state", "SP170"),
        ("jobs", "SP170"),
        ("workflows", "SP170"),
    ]


def test_the_keys_read_alone_are_not_named() -> None:
    for example in sorted(EXAMPLES.glob("*.yml")):
        assert [i for i in lint_file(example) if i.code == "SP170"] == [], example


def test_every_code_names_one_check() -> None:
    codes = [each.code for each in RULES] + [SCHEMA_CODE, DUPLICATE_KEY_CODE, ROUTE_CODE]
    codes.append(FILE_CODE)
    assert len(codes) == len(set(codes)), sorted(codes)


# --- SP171: the files a pool backend names --------------------------------------------------


def _project(folder: Path, **changes: Any) -> Path:
    data = varied(*((f"apps.renderer.{key}", value) for key, value in changes.items()))
    path = with_backend_files(folder) / "sp00ky.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _files(issues: list[Issue]) -> list[tuple[str, str, str]]:
    return [(i.path, i.message, i.severity) for i in issues if i.code == FILE_CODE]


def test_every_file_there_is_no_problem(tmp_path: Path) -> None:
    (tmp_path / "render.env").write_text("A=1\n")
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "key").write_text("k\n")
    path = _project(
        tmp_path,
        envFile=["render.env", str(tmp_path / "render.env")],
        env={"KEY": {"fromFile": "./secrets/key"}, "TOKEN": {"fromEnv": "TOKEN"}},
    )
    assert lint_file(path) == []


@pytest.mark.parametrize(
    ("changes", "path", "field", "written"),
    [
        ({"spec": "./backend/openapi.yaml"}, "spec", "spec", "./backend/openapi.yaml"),
        (
            {"deploy": {"dockerfile": "render/Dockerfile", "port": 8080, "healthcheck": "/h"}},
            "deploy.dockerfile",
            "deploy.dockerfile",
            "render/Dockerfile",
        ),
        ({"envFile": "render.env"}, "envFile", "envFile", "render.env"),
        (
            {"envFile": ["./backend/Dockerfile", "prod.env"]},
            "envFile[1]",
            "envFile[1]",
            "prod.env",
        ),
        (
            {"env": {"KEY": {"fromFile": "secrets/key"}}},
            "env.KEY.fromFile",
            "env.KEY.fromFile",
            "secrets/key",
        ),
    ],
)
def test_a_missing_file_is_an_error_naming_field_path_and_fix(
    tmp_path: Path, changes: dict[str, Any], path: str, field: str, written: str
) -> None:
    config = _project(tmp_path, **changes)
    looked = tmp_path / written.removeprefix("./")
    assert _files(lint_file(config)) == [
        (
            f"apps.renderer.{path}",
            f"`{field}` names {written!r}, but there is no file at {looked} (a relative path "
            f"starts at the directory of sp00ky.yml, {tmp_path}); fix the path, or add the "
            "file there",
            "error",
        )
    ]


def test_the_issue_carries_the_line_of_the_field(tmp_path: Path) -> None:
    path = with_backend_files(tmp_path) / "sp00ky.yml"
    text = (EXAMPLES / "sp00ky.yml").read_text()
    path.write_text(text.replace("./backend/Dockerfile", "./backend/Dockerfil"))
    (issue,) = [i for i in lint_file(path) if i.code == FILE_CODE]
    line = 1 + next(n for n, t in enumerate(text.splitlines()) if "dockerfile:" in t)
    assert (issue.path, issue.line) == ("apps.renderer.deploy.dockerfile", line)


def test_a_directory_is_not_a_file(tmp_path: Path) -> None:
    config = _project(
        tmp_path, deploy={"dockerfile": "./backend", "port": 8080, "healthcheck": "/h"}
    )
    assert _files(lint_file(config)) == [
        (
            "apps.renderer.deploy.dockerfile",
            f"`deploy.dockerfile` names './backend', but {tmp_path / 'backend'} is a directory; "
            "name the file in it",
            "error",
        )
    ]


def test_paths_start_at_the_config_s_directory_not_the_working_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _project(tmp_path / "project")
    monkeypatch.chdir(tmp_path)
    assert lint_file(Path("project") / "sp00ky.yml") == []
    with_backend_files(tmp_path)  # where a path read from the working directory would lead
    (tmp_path / "project" / "backend" / "openapi.yml").unlink()
    (issue,) = _files(lint_file(Path("project") / "sp00ky.yml"))
    assert issue[0] == "apps.renderer.spec"
    assert f"no file at {tmp_path / 'project' / 'backend' / 'openapi.yml'} " in issue[1]
    assert config.exists()


def test_env_sources_expand_home_as_the_controller_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "render.env").write_text("A=1\n")
    monkeypatch.setenv("HOME", str(home))
    config = _project(tmp_path / "project", envFile="~/render.env")
    assert lint_file(config) == []
    (home / "render.env").unlink()
    (issue,) = _files(lint_file(config))
    assert f"no file at {home / 'render.env'} " in issue[1]


def test_only_pool_backends_files_are_checked(tmp_path: Path) -> None:
    path = with_backend_files(tmp_path) / "sp00ky.yml"
    data = varied(("apps.api", {"type": "backend", "spec": "./api/openapi.yml"}))
    path.write_text(yaml.safe_dump(data))
    assert _files(lint_file(path)) == []


def test_loading_the_config_does_not_need_the_files(tmp_path: Path) -> None:
    """An env file lives on the controller: a command that loads the file elsewhere (`jobs
    list` on a laptop) must not be refused for lacking it; `lint` names it."""
    config = _project(tmp_path, envFile="/run/controller/render.env")
    assert load_config(config).backends["renderer"].env_files == ("/run/controller/render.env",)
    assert [i.path for i in lint_file(config)] == ["apps.renderer.envFile"]


def test_the_examples_name_only_files_that_are_there() -> None:
    examples = sorted(EXAMPLES.glob("*.yml"))
    assert examples
    for example in examples:
        assert _files(lint_file(example)) == [], example
