"""What `lint` and a command that loads sp00ky.yml say of a misspelled `pools`, a misspelled
`healthcheck` and an `idleTimeout` of 0: one finding each, saying what to write."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.configs import varied, with_backend_files
from tests.helpers import cli


def _write(folder: Path, data: dict[str, object]) -> Path:
    path = with_backend_files(folder) / "sp00ky.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _pools_as_pool() -> dict[str, object]:
    data = varied()
    return {("pool" if key == "pools" else key): value for key, value in data.items()}


def test_a_top_level_pool_is_named_by_lint_with_the_key_it_means(tmp_path: Path) -> None:
    done = cli("lint", str(_write(tmp_path, _pools_as_pool())))
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert any(
        line.startswith("pool: warning: ") and "did you mean 'pools'?" in line for line in lines
    ), done.stdout
    hint = "(declared: none are declared; the top-level `pool` is not read: did you mean `pools`?)"
    assert any(line.startswith("apps.renderer.runOn.pool: ") and hint in line for line in lines), (
        done.stdout
    )


def test_a_command_that_loads_the_file_says_the_same(tmp_path: Path) -> None:
    path = _write(tmp_path, _pools_as_pool())
    done = cli("simulate", "--config", str(path), "--rate", "6", "--hours", "1")
    assert done.returncode == 1
    assert "did you mean `pools`?" in done.stderr, done.stderr


def test_a_misspelled_healthcheck_is_the_typo_alone(tmp_path: Path) -> None:
    data = varied()
    deploy = data["apps"]["renderer"]["deploy"]
    deploy["healthchek"] = deploy.pop("healthcheck")
    done = cli("lint", str(_write(tmp_path, data)))
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        "apps.renderer.deploy.healthchek: unknown key 'healthchek'; did you mean "
        "'healthcheck'? [SP001] (line 26)"
    ]


def test_a_missing_healthcheck_is_still_a_warning(tmp_path: Path) -> None:
    data = varied()
    del data["apps"]["renderer"]["deploy"]["healthcheck"]
    done = cli("lint", str(_write(tmp_path, data)))
    assert "has no `deploy.healthcheck`" in done.stdout
    assert "[SP107]" in done.stdout


def test_an_idle_timeout_of_zero_is_explained_not_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, varied(("pools.render.idleTimeout", "0s")))
    done = cli("lint", str(path))
    assert done.returncode == 0, done.stdout
    assert (
        "pools.render.idleTimeout: warning: idleTimeout 0s drains a machine above min and "
        "buffer at the first tick it has no job (on Hetzner, once its paid hour is nearly "
        "over: keepPaidHours), so a job that comes later waits for a boot; give it the gap "
        "between jobs you expect (e.g. 5m) to keep such a machine warm for them [SP124]"
    ) in done.stdout
