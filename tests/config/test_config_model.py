"""Loading sp00ky.yml into frozen, typed values with the docs' defaults."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from sp00ky_infra.config import ConfigFileError, ConfigInvalid
from sp00ky_infra.config.loader import load_config
from tests.configs import varied

EXAMPLES = Path(__file__).parents[2] / "examples"


def _write(tmp_path: Path, data: dict[str, object]) -> Path:
    path = tmp_path / "sp00ky.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_docs_defaults(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, varied()))
    pool = config.pools["render"]
    assert (pool.machine.type, pool.slots, pool.lease, pool.recycle) == ("cx33", 1, 90.0, "job")
    assert pool.max_job_duration == 8 * 3600 and pool.max_lifetime == 24 * 3600
    assert pool.idle_timeout == 300 and pool.max_queued == 1000 and pool.queue_timeout == 3600
    assert (config.retention.success, config.retention.failed) == (6 * 3600, 14 * 86400)
    assert config.backend_for("render").method is not None
    assert config.backend_for("render").method.concurrency is None  # type: ignore[union-attr]


def test_values_are_frozen(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, varied()))
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.pools["render"].max = 9  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.pools["other"] = config.pools["render"]  # type: ignore[index]


def test_command_string_is_split_like_a_shell(tmp_path: Path) -> None:
    data = varied(("apps.renderer.deploy.command", "python3 -m 'my server' --port $PORT"))
    deploy = load_config(_write(tmp_path, data)).backends["renderer"].deploy
    assert deploy.command == ("python3", "-m", "my server", "--port", "$PORT")


def test_env_values_become_strings(tmp_path: Path) -> None:
    data = varied(("apps.renderer.env", {"A": 1, "B": True, "C": "x"}))
    assert dict(load_config(_write(tmp_path, data)).backends["renderer"].env) == {
        "A": "1",
        "B": "true",
        "C": "x",
    }


def test_revision_follows_what_the_machine_runs(tmp_path: Path) -> None:
    def revision(*changes: tuple[str, object]) -> str:
        config = load_config(_write(tmp_path, varied(*changes)))
        return config.backend_for("render").revision(config.pools["render"])

    base = revision()
    assert revision() == base
    assert revision(("apps.renderer.env", {"A": "1"})) != base
    assert revision(("apps.renderer.deploy.command", ["x"])) != base
    assert revision(("pools.render.slots", 2)) != base
    assert revision(("apps.renderer.deploy.port", 9090)) != base
    assert revision(("apps.renderer.deploy.healthcheck", "/ready")) != base
    assert revision(("pools.render.machine", {"type": "cpx42", "locations": ["fsn1"]})) != base
    assert revision(("pools.render.machine", {"type": "cx33", "locations": ["hel1"]})) != base
    assert revision(("pools.render.recycle", "never")) != base
    assert revision(("apps.renderer.deploy.image", "ghcr.io/acme/r:1")) != base
    assert revision(("pools.render.machine", {"type": "cx33", "image": "debian-12"})) != base
    assert revision(("pools.render.machine", {"type": "cx33", "image": "1234"})) != base
    # the default image, written or not, is the revision machines had before it could be set
    assert revision(("pools.render.machine", {"type": "cx33", "image": "docker-ce"})) == revision(
        ("pools.render.machine", {"type": "cx33"})
    )


def test_the_revision_pins_the_image_the_controller_resolved(tmp_path: Path) -> None:
    """A tag moved to a new digest (or a rebuilt image) means new machines."""
    config = load_config(_write(tmp_path, varied(("apps.renderer.deploy.image", "ghcr.io/a/r:1"))))
    backend, pool = config.backend_for("render"), config.pools["render"]
    first = backend.revision(pool, "ghcr.io/a/r@sha256:" + "1" * 64)
    assert first == backend.revision(pool, "ghcr.io/a/r@sha256:" + "1" * 64)
    assert first != backend.revision(pool, "ghcr.io/a/r@sha256:" + "2" * 64)
    assert first != backend.revision(pool)


def test_sizing_and_timing_settings_leave_the_revision_alone(tmp_path: Path) -> None:
    """Raising max (or any sizing or timing knob) must not drain and replace every machine."""

    def revision(*changes: tuple[str, object]) -> str:
        config = load_config(_write(tmp_path, varied(*changes)))
        return config.backend_for("render").revision(config.pools["render"])

    base = revision()
    for change in (
        ("pools.render.max", 5),
        ("pools.render.min", 1),
        ("pools.render.buffer", 1),
        ("pools.render.idleTimeout", "15m"),
        ("pools.render.maxLifetime", "48h"),
        ("pools.render.lease", "2m"),
        ("pools.render.bootTimeout", "5m"),
        ("pools.render.maxJobDuration", "2h"),
        ("pools.render.maxQueued", 10),
        ("pools.render.queueTimeout", "30m"),
    ):
        assert revision(change) == base, change


def test_fixed_and_autoscaled_limits(tmp_path: Path) -> None:
    config = load_config(EXAMPLES / "sizing.yml")
    assert {name: pool.limit for name, pool in config.pools.items()} == {
        "steady": 2,
        "elastic": 8,
        "instant": 10,
        "on-demand": 3,
    }


def test_invalid_config_lists_every_error(tmp_path: Path) -> None:
    data = varied(("pools.render.min", 5), ("pools.render.slots", 0))
    with pytest.raises(ConfigInvalid) as caught:
        load_config(_write(tmp_path, data))
    assert [issue.code for issue in caught.value.issues] == ["SP111", "SP115"]
    assert "has 2 problem(s)" in str(caught.value)
    assert "pools.render.min: min (5) is above max (2)" in str(caught.value)


def test_spky_config_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPKY_CONFIG", str(_write(tmp_path, varied())))
    assert "render" in load_config().pools


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigFileError, match=r"nope.yml: no such file"):
        load_config(tmp_path / "nope.yml")
