"""deploy.image references: what the deploy can pin, parsed the way Docker does."""

from __future__ import annotations

import pytest

from sp00ky_infra.config.images import ImageReference, ImageReferenceError, parse_image

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ghcr.io/acme/renderer:1.4", ImageReference("ghcr.io", "acme/renderer", "1.4")),
        ("127.0.0.1:5000/r:v1", ImageReference("127.0.0.1:5000", "r", "v1")),
        ("localhost/a/b:x", ImageReference("localhost", "a/b", "x")),
        ("python:3.12", ImageReference("docker.io", "library/python", "3.12")),
        ("acme/renderer:1", ImageReference("docker.io", "acme/renderer", "1")),
        (f"ghcr.io/acme/r@{DIGEST}", ImageReference("ghcr.io", "acme/r", None, DIGEST)),
        (f"ghcr.io/acme/r:1@{DIGEST}", ImageReference("ghcr.io", "acme/r", None, DIGEST)),
    ],
)
def test_references_parse(text: str, expected: ImageReference) -> None:
    assert parse_image(text) == expected


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("ghcr.io/acme/renderer", "neither a tag nor a digest"),
        ("ghcr.io/acme/renderer:", "tag '' is not valid"),
        ("ghcr.io/Acme/r:1", "name 'Acme/r' is not valid"),
        ("r@sha256:XYZ", "digest 'sha256:XYZ' is not sha256: and 64 lowercase hex"),
        ("bad_host.io:x/r:1", "registry 'bad_host.io:x' is not a host[:port]"),
        (" r:1", "padded with spaces"),
    ],
)
def test_malformed_references_say_why(text: str, words: str) -> None:
    with pytest.raises(ImageReferenceError) as caught:
        parse_image(text)
    assert words in str(caught.value)


def test_a_reference_prints_and_pins() -> None:
    ref = parse_image("127.0.0.1:5000/acme/r:1")
    assert str(ref) == "127.0.0.1:5000/acme/r:1"
    assert ref.insecure and not parse_image("ghcr.io/a:1").insecure
    assert str(ref.pinned(DIGEST)) == f"127.0.0.1:5000/acme/r@{DIGEST}"
    assert parse_image("python:3").api_host == "registry-1.docker.io"
