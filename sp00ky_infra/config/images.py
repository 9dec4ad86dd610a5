"""Image references (``deploy.image``): the grammar Docker's distribution/reference accepts,
restricted to what a deploy can pin: a tag or a ``sha256`` digest is required.

Pure: lint reads it for its messages, the controller for where to resolve a tag.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sp00ky_infra.config.errors import ConfigError

DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"  # where docker.io's Registry API answers
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_LABEL = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*(?::[0-9]+)?$")
_PATH = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_TAG = re.compile(r"^[\w][\w.-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[a-f0-9]{64}$")
MAX_NAME = 255
EXAMPLE = "ghcr.io/acme/renderer:1.4 or ghcr.io/acme/renderer@sha256:<64 hex digits>"


class ImageReferenceError(ConfigError, ValueError):
    """Not an image reference a deploy can pin; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class ImageReference:
    registry: str  # host[:port]; docker.io when the reference names none
    repository: str  # path under the registry: acme/renderer, library/python
    tag: str | None = None
    digest: str | None = None  # sha256:...

    @property
    def name(self) -> str:
        """registry/repository, as the Engine API's fromImage takes it."""
        return f"{self.registry}/{self.repository}"

    @property
    def api_host(self) -> str:
        """Where the registry's HTTP API answers (docker.io's lives elsewhere)."""
        return DOCKER_HUB_API if self.registry == DOCKER_HUB else self.registry

    @property
    def insecure(self) -> bool:
        """Loopback registries speak plain HTTP, as Docker allows for 127.0.0.0/8."""
        host = self.registry.rsplit(":", 1)[0] if ":" in self.registry else self.registry
        return host == "localhost" or host.startswith("127.")

    def pinned(self, digest: str) -> ImageReference:
        return ImageReference(self.registry, self.repository, None, digest)

    def __str__(self) -> str:
        if self.digest:
            return f"{self.name}@{self.digest}"
        return f"{self.name}:{self.tag}"


def parse_image(text: str) -> ImageReference:
    """``[REGISTRY/]NAME:TAG`` or ``[REGISTRY/]NAME@sha256:DIGEST`` (both: the digest wins)."""
    if not text or text != text.strip():
        raise ImageReferenceError("empty or padded with spaces")
    rest, digest = text, None
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        if not _DIGEST.match(digest):
            raise ImageReferenceError(f"digest {digest!r} is not sha256: and 64 lowercase hex")
    tag = None
    slash = rest.rfind("/")
    colon = rest.rfind(":")
    if colon > slash:
        rest, tag = rest[:colon], rest[colon + 1 :]
        if not _TAG.match(tag):
            raise ImageReferenceError(f"tag {tag!r} is not valid (letters, digits, _ . -)")
    if tag is None and digest is None:
        raise ImageReferenceError("it has neither a tag nor a digest; pin one (no implicit latest)")
    first, _, path = rest.partition("/")
    if path and ("." in first or ":" in first or first == "localhost"):
        registry = first
        if not _DOMAIN.match(registry):
            raise ImageReferenceError(f"registry {registry!r} is not a host[:port]")
    else:
        registry, path = DOCKER_HUB, rest
    if registry == DOCKER_HUB and "/" not in path:
        path = f"library/{path}"
    if not _PATH.match(path):
        raise ImageReferenceError(
            f"name {path!r} is not valid (lowercase letters, digits and . _ - between /)"
        )
    if len(f"{registry}/{path}") > MAX_NAME:
        raise ImageReferenceError(f"the name is longer than {MAX_NAME} characters")
    return ImageReference(registry, path, None if digest else tag, digest)
