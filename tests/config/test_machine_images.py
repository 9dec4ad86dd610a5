"""machine.image's grammar: an image name, a snapshot id, or a label selector of snapshots."""

from __future__ import annotations

import pytest

from sp00ky_infra.config.machine_images import (
    KNOWN_IMAGES,
    SelectorError,
    has_docker,
    image_kind,
    parse_selector,
)


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ("docker-ce", "name"),
        ("debian-12", "name"),
        ("ubuntu-24.04", "name"),
        ("123456789", "id"),
        ("sp00ky/agent=abc,os=debian", "selector"),
        ("os!=windows", "selector"),
        ("!legacy", "selector"),
        ("os in (debian, ubuntu)", "selector"),
        ("os notin (windows)", "selector"),
        ("os==debian", "selector"),
        ("sp00ky/agent", "selector"),
        ("baked", "baked"),
        ("Baked", None),
        ("Debian", None),
        ("Debian 12", None),
        ("=debian", None),
        ("sp00ky/agent=abc,", None),
    ],
)
def test_each_value_is_told_apart_by_its_form(value: str, kind: str | None) -> None:
    assert image_kind(value) == kind


def test_a_selector_matches_as_the_api_reads_it() -> None:
    labels = {"sp00ky/agent": "abc", "os": "debian"}

    def matches(selector: str) -> bool:
        return all(term.matches(labels) for term in parse_selector(selector))

    assert matches("sp00ky/agent=abc,os=debian")
    assert matches("os in (ubuntu, debian),!legacy,sp00ky/agent")
    assert not matches("os notin (debian)")
    assert not matches("sp00ky/agent!=abc")
    assert not matches("legacy")


def test_a_bad_term_is_named() -> None:
    with pytest.raises(SelectorError, match=r"^'=x' does not start with a label key"):
        parse_selector("os=debian,=x")
    with pytest.raises(SelectorError, match=r"^'os=deb ian': 'deb ian' is not a label value"):
        parse_selector("os=deb ian")


def test_docker_is_known_for_the_public_images_only() -> None:
    assert has_docker("docker-ce") is True
    assert has_docker("debian-12") is False
    assert has_docker("123456789") is None
    assert KNOWN_IMAGES["docker-ce"].os_flavor == "ubuntu"
