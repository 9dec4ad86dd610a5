"""The image reaches the machine: served by the controller, or pulled from a registry, into a
second, empty Docker engine (the machine's own), against real engines and a real registry."""

from __future__ import annotations

import io
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
import requests

from agent.docker import DockerAPI
from agent.images import ImageError, ImageUnavailable, ensure_image
from agent.protocol import ImageSource, RegistryCredentials
from sp00ky_infra.config.images import parse_image
from sp00ky_infra.controller.images import CHUNK_BYTES, ImageServer, UnknownImage
from sp00ky_infra.controller.registry import (
    ImageNotFound,
    RegistryDenied,
    Resolver,
    load_auths,
)
from tests.engines import Engine, Registry

TINY = "sp00ky-test/tiny:1"


@pytest.fixture(scope="module")
def tiny_image(tmp_path_factory: pytest.TempPathFactory) -> str:
    """FROM scratch and one file: an image of its own, quick to move around."""
    folder = tmp_path_factory.mktemp("tiny")
    (folder / "hello.txt").write_text("hello from the controller\n" * 1000)
    (folder / "Dockerfile").write_text('FROM scratch\nCOPY hello.txt /\nCMD ["/hello"]\n')
    subprocess.run(
        ["docker", "build", "-q", "-t", TINY, str(folder)], check=True, capture_output=True
    )
    image_id = subprocess.run(
        ["docker", "image", "inspect", "-f", "{{.Id}}", TINY],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    return image_id


class Streamed:
    """What the agent's fetch returns (a streamed ``requests`` response), over any chunks."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks = chunks
        self.closed = False

    def iter_content(self, size: int) -> Iterator[bytes]:
        return self.chunks

    def close(self) -> None:
        self.closed = True


class Logged:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, event: str, **fields: Any) -> None:
        self.events.append((event, fields))

    def names(self) -> list[str]:
        return [event for event, _ in self.events]


@pytest.fixture
def server() -> Iterator[ImageServer]:
    served = ImageServer.connect()
    yield served
    served.close()


# --- served by the controller -----------------------------------------------------------------


def test_a_served_image_streams_into_an_empty_engine_once(
    server: ImageServer, tiny_image: str, machine_engine: Engine
) -> None:
    server.serve(tiny_image)
    api, log, fetched = DockerAPI(machine_engine.socket), Logged(), []

    def fetch(image_id: str) -> Streamed:
        fetched.append(image_id)
        return Streamed(server.stream(image_id))

    assert tiny_image not in machine_engine.images()
    source = ImageSource(source="controller", reference=tiny_image, name="sp00ky-dev-pool-tiny")
    got = ensure_image(api, source, fetch, log, deadline=1e12)
    assert got == tiny_image and fetched == [tiny_image]
    assert tiny_image in machine_engine.images()
    tagged = machine_engine.docker("image", "inspect", "-f", "{{.RepoTags}}", tiny_image).stdout
    assert f"sp00ky-dev-pool-tiny:{tiny_image[7:19]}" in tagged
    assert log.names() == ["image_fetch", "image_progress", "image_ready"]
    # a second boot on the same machine: nothing travels again
    again = Logged()
    ensure_image(api, ImageSource(source="controller", reference=tiny_image), fetch, again, 1e12)
    assert fetched == [tiny_image] and again.names() == ["image_cached"]


def test_a_stream_cut_short_is_retried_then_fails_naming_the_image(
    server: ImageServer, tiny_image: str, machine_engine: Engine
) -> None:
    server.serve(tiny_image)
    whole = b"".join(server.stream(tiny_image))
    log, pauses = Logged(), list[float]()

    def cut(image_id: str) -> Streamed:
        return Streamed(iter([whole[: len(whole) // 2]]))

    with pytest.raises(ImageError) as caught:
        ensure_image(DockerAPI(machine_engine.socket),
                     ImageSource(source="controller", reference=tiny_image), cut, log,
                     deadline=_now() + 3.0, sleep=pauses.append)  # fmt: skip
    assert not isinstance(caught.value, ImageUnavailable)
    assert f"image {tiny_image} did not arrive before the boot timeout" in str(caught.value)
    assert pauses[:3] == [0.5, 1.0, 2.0] and "image_retry" in log.names()
    assert tiny_image not in machine_engine.images()


def test_a_different_image_does_not_check_out(
    server: ImageServer, tiny_image: str, docker_images: str, machine_engine: Engine
) -> None:
    """What arrives must be the image asked for: its id is the digest of its content."""
    server.serve(tiny_image)
    other = _tar_of_an_image_with_another_id(b"".join(server.stream(tiny_image)))

    with pytest.raises(ImageError) as caught:
        ensure_image(DockerAPI(machine_engine.socket),
                     ImageSource(source="controller", reference=tiny_image),
                     lambda _: Streamed(iter([other])), Logged(),
                     deadline=_now() + 0.4, sleep=lambda _: None)  # fmt: skip
    assert f"image {tiny_image} did not check out: the engine loaded sha256:" in str(caught.value)


def test_a_missing_image_fails_at_once(machine_engine: Engine) -> None:
    def refused(image_id: str) -> Streamed:
        raise ImageUnavailable(f"image {image_id} is not one this controller serves")

    pauses: list[float] = []
    with pytest.raises(ImageUnavailable, match=r"image sha256:0+ is not one this controller"):
        ensure_image(DockerAPI(machine_engine.socket),
                     ImageSource(source="controller", reference="sha256:" + "0" * 64), refused,
                     Logged(), deadline=1e12, sleep=pauses.append)  # fmt: skip
    assert pauses == []


def test_the_controller_serves_only_its_own_images(server: ImageServer, tiny_image: str) -> None:
    with pytest.raises(UnknownImage, match="is not one this controller serves"):
        server.stream(tiny_image)


def test_an_image_is_saved_once_and_machines_are_sent_the_saved_file(
    tmp_path: Path, machine_engine: Engine
) -> None:
    """Once saved, the image travels from the file: it still arrives whole (its id checks
    out) after the controller's engine has lost it, in chunks of at most CHUNK_BYTES."""
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "note.txt").write_text(f"saved once {tmp_path}\n" * 1000)
    (tmp_path / "build" / "Dockerfile").write_text("FROM scratch\nCOPY note.txt /\n")
    built = subprocess.run(["docker", "build", "-q", str(tmp_path / "build")],
                           check=True, capture_output=True, text=True)  # fmt: skip
    image_id = built.stdout.strip()
    spool = tmp_path / "spool"
    spool.mkdir()
    server = ImageServer(docker.from_env(), spool=str(spool))
    server.serve(image_id)
    first = list(server.stream(image_id))
    assert [each.name for each in spool.glob("*/*")] == [f"{image_id[7:]}.tar"]
    assert max(len(chunk) for chunk in first) <= CHUNK_BYTES

    subprocess.run(["docker", "rmi", image_id], check=True, capture_output=True)
    got = ensure_image(DockerAPI(machine_engine.socket),
                       ImageSource(source="controller", reference=image_id),
                       lambda asked: Streamed(server.stream(asked)), Logged(),
                       deadline=1e12)  # fmt: skip
    assert got == image_id and image_id in machine_engine.images()
    assert b"".join(server.stream(image_id)) == b"".join(first)
    server.close()
    assert list(spool.iterdir()) == []


def test_an_image_gone_from_the_engine_is_refused_at_once(tmp_path: Path) -> None:
    server = ImageServer(docker.from_env(), spool=str(tmp_path))
    missing = server.serve("sha256:" + "0" * 64)
    with pytest.raises(UnknownImage, match="is no longer on the controller's engine"):
        server.stream(missing)
    server.close()


# --- from a registry -------------------------------------------------------------------------


def test_a_tag_resolves_to_the_pushed_digest(image_registry: Registry, tiny_image: str) -> None:
    digest = image_registry.push(TINY, "acme/tiny:1")
    ref = parse_image(f"{image_registry.host}/acme/tiny:1")
    resolver = Resolver(load_auths(str(image_registry.docker_config)))
    assert str(resolver.resolve(ref)) == f"{image_registry.host}/acme/tiny@{digest}"
    pinned = parse_image(f"{image_registry.host}/acme/tiny@{digest}")
    assert resolver.resolve(pinned) == pinned

    with pytest.raises(RegistryDenied) as denied:
        Resolver({}).resolve(ref)
    assert (
        f"image {ref}: the registry {image_registry.host} wants credentials and there are none "
        "for it; add them to a docker config.json" in str(denied.value)
    )
    with pytest.raises(ImageNotFound) as missing:
        resolver.resolve(parse_image(f"{image_registry.host}/acme/tiny:2"))
    assert f"image {image_registry.host}/acme/tiny:2: the registry has no such" in str(
        missing.value
    )


def test_the_machine_pulls_the_digest_with_the_credentials(
    image_registry: Registry, tiny_image: str, machine_engine: Engine
) -> None:
    digest = image_registry.push(TINY, "acme/tiny:1")
    pinned = f"{image_registry.host}/acme/tiny@{digest}"
    auth = RegistryCredentials.from_json(
        load_auths(str(image_registry.docker_config))[image_registry.host].as_dict()
    )
    api = DockerAPI(machine_engine.socket)

    def no_fetch(_: str) -> Streamed:
        raise AssertionError("a registry image never comes from the controller")

    with pytest.raises(ImageUnavailable) as unauthorised:
        ensure_image(api, ImageSource(source="registry", reference=pinned), no_fetch,
                     Logged(), deadline=1e12)  # fmt: skip
    assert f"image {pinned}: the registry refused the pull" in str(unauthorised.value)

    missing = f"{image_registry.host}/acme/nope@{digest}"
    with pytest.raises(ImageUnavailable, match=f"image {missing} is not in its registry"):
        ensure_image(api, ImageSource(source="registry", reference=missing, auth=auth), no_fetch,
                     Logged(), deadline=1e12)  # fmt: skip

    log = Logged()
    got = ensure_image(api, ImageSource(source="registry", reference=pinned, auth=auth), no_fetch,
                       log, deadline=1e12)  # fmt: skip
    assert got == pinned and tiny_image in machine_engine.images()
    assert log.names()[0] == "image_fetch" and log.names()[-1] == "image_ready"


def test_an_unreachable_registry_is_retried(machine_engine: Engine) -> None:
    pauses: list[float] = []
    pinned = "127.0.0.1:9/acme/tiny@sha256:" + "1" * 64
    with pytest.raises(ImageError, match=f"image {pinned} did not arrive before the boot timeout"):
        ensure_image(DockerAPI(machine_engine.socket),
                     ImageSource(source="registry", reference=pinned),
                     lambda _: Streamed(iter([])), Logged(), deadline=_now() + 2.0,
                     sleep=pauses.append)  # fmt: skip
    assert pauses and pauses[0] == 0.5


def test_a_bearer_challenge_is_answered_with_a_token() -> None:
    """What Docker Hub and GHCR ask: a token from the realm, for the repository's pull scope."""
    digest = "sha256:" + "c" * 64
    seen: list[tuple[str, str, dict[str, Any]]] = []

    class Session(requests.Session):
        def request(  # type: ignore[override]  # the one seam, answered with real Responses
            self, method: str | bytes, url: str | bytes, **kwargs: Any
        ) -> requests.Response:
            seen.append((str(method), str(url), kwargs))
            headers = kwargs.get("headers") or {}
            if "token" in str(url):
                assert kwargs["params"] == {"scope": "repository:acme/r:pull", "service": "reg"}
                assert kwargs["auth"] == ("u", "p")
                return _response(200, {}, b'{"token": "T0K"}')
            if headers.get("Authorization") != "Bearer T0K":
                challenge = 'Bearer realm="https://auth.example/token",service="reg"'
                return _response(401, {"WWW-Authenticate": challenge})
            return _response(200, {"Docker-Content-Digest": digest})

    from sp00ky_infra.controller.registry import RegistryAuth

    resolver = Resolver({"reg.example": RegistryAuth("u", "p", "reg.example")}, http=Session())
    pinned = resolver.resolve(parse_image("reg.example/acme/r:1"))
    assert str(pinned) == f"reg.example/acme/r@{digest}"
    assert [method for method, _, _ in seen] == ["HEAD", "GET", "HEAD"]
    assert "application/vnd.oci.image.index.v1+json" in seen[0][2]["headers"]["Accept"]


def _response(status: int, headers: dict[str, str], body: bytes = b"") -> requests.Response:
    answer = requests.Response()
    answer.status_code = status
    answer.headers.update(headers)
    answer._content = body
    return answer


def _now() -> float:
    import time

    return time.monotonic()


def _tar_of_an_image_with_another_id(saved: bytes) -> bytes:
    """The same layers under another config (one more label): a valid image, another id."""
    import hashlib
    import json

    source = tarfile.open(fileobj=io.BytesIO(saved))  # noqa: SIM115 (read while writing)
    manifest = json.loads(source.extractfile("manifest.json").read())  # type: ignore[union-attr]
    config_name = manifest[0]["Config"]
    config = json.loads(source.extractfile(config_name).read())  # type: ignore[union-attr]
    config.setdefault("config", {})["Labels"] = {"tampered": "yes"}
    raw = json.dumps(config).encode()
    new_name = hashlib.sha256(raw).hexdigest() + ".json"
    manifest[0]["Config"] = new_name
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as target:
        for member in source.getmembers():
            if member.name in (config_name, "manifest.json"):
                continue
            target.addfile(member, source.extractfile(member) if member.isfile() else None)
        for name, data in ((new_name, raw), ("manifest.json", json.dumps(manifest).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            target.addfile(info, io.BytesIO(data))
    return out.getvalue()
