"""Which rehearsal image a server boots, and what the rehearsal says of each pool's Hetzner
image: pure, no Docker engine needed."""

from __future__ import annotations

import pytest

from sp00ky_infra.rehearse.boot import Booter
from sp00ky_infra.rehearse.cloud import FakeHetzner
from sp00ky_infra.rehearse.image import Recipe, main
from sp00ky_infra.rehearse.phases import DOCKER_INSTALL_SECONDS, PHASES, estimate, image_notes


def test_the_variant_without_docker_is_the_same_recipe_less_docker_under_its_own_tag() -> None:
    recipe, bare = Recipe(), Recipe().without_docker()
    assert recipe.has_docker and not bare.has_docker
    assert set(recipe.packages) - set(bare.packages) == {"docker.io"}
    assert bare.tag != recipe.tag and bare.tag.split(":")[0] == recipe.tag.split(":")[0]
    assert bare.without_docker() == bare


def test_the_image_script_takes_only_the_variant_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--with-docker"]) == 2
    assert "usage: scripts/rehearsal-image [--without-docker]" in capsys.readouterr().err


def test_a_server_boots_the_rehearsal_image_its_hetzner_image_maps_to() -> None:
    booter = Booter("rehearsal:docker", images={"debian-12": "rehearsal:bare"})
    assert booter.image_for("debian-12") == "rehearsal:bare"
    assert booter.image_for("docker-ce") == "rehearsal:docker"
    assert booter.image_for("123456") == "rehearsal:docker"  # a snapshot: assumed to have it
    assert booter.image_for(None) == "rehearsal:docker"


def test_an_image_without_docker_is_named_as_the_slow_path() -> None:
    notes = image_notes({"render": "debian-12"}, installs_here=False)
    assert notes == [
        "render: image debian-12 has no Docker: install-agent.sh installs docker.io at boot, "
        "about 30 s on Hetzner (assumed); rehearsed here with Docker present, so not measured "
        "(build the variant without it: scripts/rehearsal-image --without-docker)"
    ]
    measured = image_notes({"render": "debian-12"}, installs_here=True)
    assert measured[0].endswith("(assumed); measured here on the rehearsal image without Docker")


def test_the_default_image_and_a_snapshot_are_named_for_what_they_are() -> None:
    notes = image_notes({"render": "docker-ce", "batch": "sp00ky/agent=abc"}, installs_here=False)
    assert notes == [
        "render: image docker-ce has Docker, so nothing is installed at boot; it is ubuntu "
        "24.04, rehearsed here on Debian 12",
        "batch: image sp00ky/agent=abc is a snapshot (or an image not known here), rehearsed "
        "on a stand-in with Docker; where it lacks Docker or python3-requests, "
        "install-agent.sh installs them at boot",
    ]


def test_the_estimate_adds_the_docker_install_only_where_it_was_not_measured() -> None:
    ready = [dict.fromkeys(PHASES, 2.0)]
    measured = estimate(ready)
    unmeasured = estimate(ready, unmeasured_install=True)
    assert measured["agent install"] == 2.0
    assert unmeasured["agent install"] == 2.0 + DOCKER_INSTALL_SECONDS
    assert unmeasured["total"] == measured["total"] + DOCKER_INSTALL_SECONDS  # type: ignore[operator]


@pytest.mark.parametrize("image", ["sp00ky/agent=abc,os in (debian, ubuntu),!legacy", "4711"])
def test_a_rehearsal_stands_in_for_a_pools_own_snapshot(image: str) -> None:
    """The fake cloud has none of the user's snapshots: the rehearsal makes one that the
    pool's image names, so the machine provider resolves it as it would on Hetzner."""
    with FakeHetzner() as cloud:
        made = cloud.stand_in(image)
        assert made["type"] == "snapshot" and made["name"] is None
        if image.isdigit():
            assert made["id"] == 4711
        else:
            assert made["labels"] == {"sp00ky/agent": "abc", "os": "debian"}
        assert cloud.stand_in("docker-ce")["type"] == "app"  # known: none made
        assert cloud.stand_in("fedora-42")["name"] == "fedora-42"
