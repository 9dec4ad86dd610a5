"""Join tokens (pure crypto) and the controller's settings from the environment."""

from __future__ import annotations

import pytest

from sp00ky_infra.config.model import Pool
from sp00ky_infra.controller.settings import ControllerSettings, SettingsError, Timings
from sp00ky_infra.shared import tokens

NOW = 1_700_000_000.0


def test_a_join_token_verifies_for_its_machine_until_it_expires() -> None:
    token = tokens.issue_join_token("s3cret", "render-a1", NOW, ttl=60)
    claim = tokens.verify_join_token("s3cret", token, "render-a1", NOW + 59)
    assert claim.machine == "render-a1" and claim.expires == int(NOW + 60) and claim.nonce
    with pytest.raises(tokens.TokenError, match="has expired"):
        tokens.verify_join_token("s3cret", token, "render-a1", NOW + 61)
    with pytest.raises(tokens.TokenError, match="is for machine 'render-a1', not 'render-b2'"):
        tokens.verify_join_token("s3cret", token, "render-b2", NOW)
    with pytest.raises(tokens.TokenError, match="signature does not match"):
        tokens.verify_join_token("other", token, "render-a1", NOW)


def test_a_token_cannot_be_edited_into_another_machines() -> None:
    token = tokens.issue_join_token("s3cret", "a", NOW)
    body, signature = token.split(".")
    import base64

    forged_body = (
        base64.urlsafe_b64encode(base64.urlsafe_b64decode(body + "==").replace(b"a|", b"b|", 1))
        .rstrip(b"=")
        .decode()
    )
    with pytest.raises(tokens.TokenError, match="signature does not match"):
        tokens.verify_join_token("s3cret", f"{forged_body}.{signature}", "b", NOW)


def test_tokens_are_one_of_a_kind_and_sessions_are_hashed() -> None:
    assert tokens.issue_join_token("s", "m", NOW) != tokens.issue_join_token("s", "m", NOW)
    session = tokens.new_session_token()
    assert len(session) >= 40 and tokens.session_hash(session) != session
    with pytest.raises(tokens.TokenError, match="SPKY_POOL_SECRET is empty"):
        tokens.issue_join_token("", "m", NOW)


def test_settings_from_the_environment() -> None:
    settings = ControllerSettings.from_env(
        {
            "SPKY_POOL_PORT": "9000",
            "SPKY_POOL_PUBLIC_URL": "https://pool.example.com",
            "SPKY_TICK": "500ms",
            "SPKY_POOL_MAX_MACHINES": "12",
            "SPKY_POOL_TIMINGS": "lease=3s, idleTimeout=2s",
            "SPKY_STORE": "sqlite:////tmp/x.db",
        }
    )
    assert (settings.pool_port, settings.tick, settings.max_machines) == (9000, 0.5, 12)
    assert settings.agents_url == "https://pool.example.com"
    assert settings.store_url == "sqlite:////tmp/x.db"
    pool = settings.pool(Pool(name="p"))
    assert (pool.lease, pool.idle_timeout, pool.max_lifetime) == (3.0, 2.0, 86400.0)
    assert ControllerSettings.from_env({}).agents_url == "http://127.0.0.1:9669"
    assert ControllerSettings.from_env({"SPKY_POOL_DOCKER": "1"}).provider == "docker"


def test_unset_the_provider_follows_each_pool_and_an_override_takes_every_pool() -> None:
    hetzner, docker = Pool(name="render"), Pool(name="thumbs", provider="docker")
    pools = {"render": hetzner, "thumbs": docker}
    for unset in ({}, {"SPKY_POOL_PROVIDER": "pulumi"}):  # pulumi: the stack's former name
        own = ControllerSettings.from_env(unset)
        assert own.provider == ""
        assert own.serving(pools) == {"pulumi": ["render"], "docker": ["thumbs"]}
        assert own.settles_images(pools) and not own.settles_images({"thumbs": docker})
    every = ControllerSettings.from_env({"SPKY_POOL_PROVIDER": "local"})
    assert every.serving(pools) == {"local": ["render", "thumbs"]}
    assert ControllerSettings.from_env({"SPKY_POOL_DOCKER": "1"}).serving(pools) == {
        "docker": ["render", "thumbs"]
    }
    with pytest.raises(SettingsError, match="'aws' is not a provisioner; use local or docker"):
        ControllerSettings.from_env({"SPKY_POOL_PROVIDER": "aws"})


def test_a_remote_provisioner_needs_a_stable_secret(tmp_path: object) -> None:
    settings = ControllerSettings.from_env({"SPKY_POOL_DOCKER": "1"}, state_dir=str(tmp_path))
    with pytest.raises(SettingsError, match="SPKY_POOL_SECRET is not set"):
        settings.with_secrets()
    own = ControllerSettings.from_env({}, state_dir=str(tmp_path))  # each pool's own provider
    with pytest.raises(SettingsError, match="SPKY_POOL_SECRET is not set"):
        own.with_secrets()
    local_env = {"SPKY_POOL_PROVIDER": "local"}
    local = ControllerSettings.from_env(local_env, state_dir=str(tmp_path)).with_secrets()
    assert local.secret and local.admin_token
    again = ControllerSettings.from_env(local_env, state_dir=str(tmp_path)).with_secrets()
    assert again.admin_token == local.admin_token  # kept in the state dir for the CLI


def test_timings_refuse_unknown_keys() -> None:
    with pytest.raises(SettingsError, match="unknown timing 'speed'"):
        Timings.parse("speed=1s")
    assert Timings.parse("") == Timings()
