"""Registry images (``deploy.image``): a tag resolved to its digest once per deploy, and the
credentials machines pull that digest with.

Resolution speaks the Registry HTTP API v2 with ``requests``: ``HEAD /v2/NAME/manifests/TAG``
with the manifest types in Accept, the digest from ``Docker-Content-Digest``, and on a 401 the
challenge answered: Basic with the credentials, or Bearer with a token fetched from the realm
(``scope=repository:NAME:pull``), as Docker Hub, GHCR and most registries ask.

Credentials come from a docker ``config.json`` (the convention ``docker login`` writes):
``SPKY_REGISTRY_AUTH`` names the file; unset, ``$DOCKER_CONFIG/config.json`` or
``~/.docker/config.json`` when it exists. Entries under ``auths`` with ``auth`` (base64
``user:password``) or ``username``/``password`` are read; credential helpers are not run.
They travel to a machine only in its join reply, over the agent's authenticated connection.

RegistryError (a ControllerError): the message names the image and what to do.
├── ImageNotFound      the registry has no such repository, tag or digest
└── RegistryDenied     no credentials for the registry, or refused ones
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import requests

from sp00ky_infra.config.images import DOCKER_HUB, ImageReference
from sp00ky_infra.controller.errors import ControllerError

MANIFEST_TYPES = ", ".join(
    (
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
)
TIMEOUT_SECONDS = 30.0
ATTEMPTS = 4  # a registry that does not answer: 4 tries over about 3 s, then the start fails
_CHALLENGE = re.compile(r'(\w+)="([^"]*)"')


class RegistryError(ControllerError):
    """The image cannot be resolved; the message names it and says what to do."""


class ImageNotFound(RegistryError):
    pass


class RegistryDenied(RegistryError):
    pass


@dataclass(frozen=True, slots=True)
class RegistryAuth:
    """Credentials for one registry, in the shape the Engine API's X-Registry-Auth takes."""

    username: str
    password: str
    serveraddress: str

    def as_dict(self) -> dict[str, str]:
        return {
            "username": self.username,
            "password": self.password,
            "serveraddress": self.serveraddress,
        }


def default_auth_file(env: Mapping[str, str]) -> str:
    """SPKY_REGISTRY_AUTH, else docker's own config.json when there is one, else ""."""
    if env.get("SPKY_REGISTRY_AUTH"):
        return env["SPKY_REGISTRY_AUTH"]
    home = env.get("DOCKER_CONFIG") or str(Path(env.get("HOME", "~")).expanduser() / ".docker")
    path = Path(home) / "config.json"
    return str(path) if path.is_file() else ""


def _host_of(key: str) -> str:
    """A config.json key ("https://index.docker.io/v1/", "ghcr.io", "http://h:5000") as a host."""
    host = key.split("://", 1)[-1].split("/", 1)[0]
    return DOCKER_HUB if host in ("index.docker.io", "registry-1.docker.io") else host


def load_auths(path: str) -> dict[str, RegistryAuth]:
    """The credentials in a docker config.json, by registry host; {} for no file."""
    if not path:
        return {}
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise RegistryError(f"SPKY_REGISTRY_AUTH {path}: cannot read it: {exc}") from exc
    auths: dict[str, RegistryAuth] = {}
    for key, entry in (data.get("auths") or {}).items():
        username, password = entry.get("username"), entry.get("password")
        if entry.get("auth"):
            try:
                decoded = base64.b64decode(entry["auth"]).decode()
            except ValueError as exc:
                raise RegistryError(f"{path}: auths.{key}.auth is not base64: {exc}") from exc
            username, _, password = decoded.partition(":")
        if username and password:
            host = _host_of(key)
            auths[host] = RegistryAuth(username, password, host)
    return auths


class Resolver:
    """Resolves tags to digests; ``http`` and ``sleep`` are injected for tests."""

    def __init__(
        self,
        auths: Mapping[str, RegistryAuth],
        http: requests.Session | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.auths = dict(auths)
        self.http = http or requests.Session()
        self.sleep = sleep

    def auth_for(self, ref: ImageReference) -> RegistryAuth | None:
        return self.auths.get(ref.registry)

    def resolve(self, ref: ImageReference) -> ImageReference:
        """The reference pinned to the digest its tag points at now (a digest stays as is)."""
        if ref.digest:
            return ref
        for attempt in range(ATTEMPTS):
            try:
                return ref.pinned(self._head(ref))
            except requests.RequestException as exc:
                if attempt == ATTEMPTS - 1:
                    raise RegistryError(
                        f"image {ref}: the registry {ref.api_host} does not answer ({exc}); "
                        "check the host and the network, then start again"
                    ) from exc
                self.sleep(0.2 * 2**attempt)
        raise AssertionError("unreachable")

    def _head(self, ref: ImageReference) -> str:
        scheme = "http" if ref.insecure else "https"
        url = f"{scheme}://{ref.api_host}/v2/{ref.repository}/manifests/{ref.tag}"
        headers = {"Accept": MANIFEST_TYPES}
        answer = self.http.head(url, headers=headers, timeout=TIMEOUT_SECONDS)
        if answer.status_code == 401:
            headers.update(self._answer_challenge(ref, answer))
            answer = self.http.head(url, headers=headers, timeout=TIMEOUT_SECONDS)
        if answer.status_code >= 500:
            raise requests.RequestException(f"{answer.status_code} from {url}")
        if answer.status_code in (401, 403):
            raise RegistryDenied(self._denied(ref))
        if answer.status_code == 404:
            raise ImageNotFound(
                f"image {ref}: the registry has no such repository or tag (404); "
                "push it, or fix deploy.image"
            )
        answer.raise_for_status()
        digest = answer.headers.get("Docker-Content-Digest")
        if not digest:  # some registries leave it out of HEAD: the manifest's own hash
            body = self.http.get(url, headers=headers, timeout=TIMEOUT_SECONDS)
            body.raise_for_status()
            digest = "sha256:" + hashlib.sha256(body.content).hexdigest()
        return digest

    def _answer_challenge(self, ref: ImageReference, answer: requests.Response) -> dict[str, str]:
        challenge = answer.headers.get("WWW-Authenticate", "")
        scheme, _, rest = challenge.partition(" ")
        params = dict(_CHALLENGE.findall(rest))
        auth = self.auth_for(ref)
        basic = (auth.username, auth.password) if auth else None
        if scheme.lower() == "basic":
            if basic is None:
                raise RegistryDenied(self._denied(ref))
            token = base64.b64encode(f"{basic[0]}:{basic[1]}".encode()).decode()
            return {"Authorization": f"Basic {token}"}
        if scheme.lower() != "bearer" or "realm" not in params:
            raise RegistryDenied(f"image {ref}: the registry asks for {challenge!r}, not known")
        query = {"scope": f"repository:{ref.repository}:pull"}
        if "service" in params:
            query["service"] = params["service"]
        got = self.http.get(params["realm"], params=query, auth=basic, timeout=TIMEOUT_SECONDS)
        if got.status_code in (401, 403):
            raise RegistryDenied(self._denied(ref))
        got.raise_for_status()
        body = got.json()
        return {"Authorization": f"Bearer {body.get('token') or body.get('access_token')}"}

    def _denied(self, ref: ImageReference) -> str:
        auth = self.auth_for(ref)
        if auth is None:
            return (
                f"image {ref}: the registry {ref.registry} wants credentials and there are none "
                f"for it; add them to a docker config.json (docker login {ref.registry}) and "
                "point SPKY_REGISTRY_AUTH at it"
            )
        return (
            f"image {ref}: the registry {ref.registry} refused the credentials for "
            f"{auth.username!r} (or they may not pull {ref.repository}); "
            "fix them in SPKY_REGISTRY_AUTH's config.json"
        )
