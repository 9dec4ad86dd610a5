"""The image a pool machine boots (``machine.image``): its grammar, and the public Hetzner
images known here.

A value is one of four things, told apart by its form alone (this module does no I/O):

- a snapshot's (or any image's) id: digits, ``123456789``, passed to POST /servers as a number;
- a label selector of snapshots: ``sp00ky/agent=abc,os=debian``, anything with an operator
  (``=``, ``==``, ``!=``, ``!key``, ``key in (a,b)``, ``key notin (a,b)``); the newest
  available snapshot that matches is used, as the Kubernetes cluster-autoscaler's Hetzner
  provider selects one for HCLOUD_IMAGE (``cluster-autoscaler/cloudprovider/hetzner/
  hetzner_node_group.go: findImage``: type snapshot, status available, ``sort=created:desc``,
  the server type's architecture, the first). A bare word is a name, never a selector; a
  prefixed key alone (``sp00ky/agent``: has that label) is a selector;
- a Hetzner image name, system or app: ``docker-ce``, ``debian-12``;
- ``baked``: the pool's own snapshot, made by the controller at deploy from the default image
  (``docker-ce``) with the agent and the backend's image on its disk (``shared/recipe.py``);
  until it exists the pool's machines boot that default image.

Selectors follow the API reference's "Label Selector" grammar
(https://docs.hetzner.cloud/reference/cloud#label-selector): terms joined by commas, keys
with an optional DNS-name prefix (``sp00ky/agent``), values of up to 63 characters.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from sp00ky_infra.config.errors import ConfigError

ImageKind = Literal["id", "name", "selector", "baked"]
ImageType = Literal["system", "app", "snapshot"]

_NAME = re.compile(r"^[a-z0-9]+(?:[.-][a-z0-9]+)*$")
_LABEL_NAME = r"[A-Za-z0-9](?:[-_.A-Za-z0-9]{0,61}[A-Za-z0-9])?"
_KEY = re.compile(rf"^(?:[a-z0-9](?:[-.a-z0-9]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}$")
_VALUE = re.compile(rf"^(?:{_LABEL_NAME})?$")
_SET = re.compile(r"^(\S+)\s+(in|notin)\s+\((.*)\)$")
SELECTOR_EXAMPLE = "sp00ky/agent=abc,os=debian"
BAKED = "baked"  # the pool's own snapshot, made by the controller (the module docstring)


@dataclass(frozen=True, slots=True)
class KnownImage:
    """A public Hetzner image: its API name, type, operating system, whether Docker is on it
    (so that install-agent.sh installs nothing at boot) and where that is written."""

    name: str
    type: ImageType
    description: str
    os_flavor: str
    os_version: str
    docker: bool
    source: str


# Not the API's whole list: the images this project's documents and tests speak of. The
# agent needs python3 and python3-requests on each: cloud-init runs on every one of them, and
# Debian's and Ubuntu's cloud-init packages depend on python3-requests (its requirements.txt
# names ``requests``; ``apt-cache depends cloud-init`` on Debian 12 lists python3-requests).
KNOWN_IMAGES: Mapping[str, KnownImage] = {
    known.name: known
    for known in (
        KnownImage(
            "docker-ce", "app", "Docker CE", "ubuntu", "24.04", True,
            "hetznercloud/apps apps/hetzner/docker-ce (1441bb1, 2025-03-20): README.md "
            "creates it with \"image\":\"docker-ce\"; template.pkr.hcl builds it on "
            "ubuntu-24.04 and scripts/docker.sh installs docker-ce and docker-compose-plugin "
            "from download.docker.com and enables docker.service",
        ),
        KnownImage(
            "debian-12", "system", "Debian 12", "debian", "12", False,
            "Hetzner's Debian 12 system image: no Docker (install-agent.sh installs docker.io)",
        ),
        KnownImage(
            "ubuntu-24.04", "system", "Ubuntu 24.04", "ubuntu", "24.04", False,
            "the docker-ce app's base (hetznercloud/apps template.pkr.hcl hcloud_image)",
        ),
        KnownImage(
            "ubuntu-22.04", "system", "Ubuntu 22.04", "ubuntu", "22.04", False,
            "the docker-ce app's base before 2024-05-30 (hetznercloud/apps beff412)",
        ),
    )
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Term:
    """One term of a label selector: ``op`` is =, !=, exists, !exists, in or notin."""

    key: str
    op: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        return {
            "=": value == (self.values[0] if self.values else None),
            "!=": value != (self.values[0] if self.values else None),
            "exists": present,
            "!exists": not present,
            "in": value in self.values,
            "notin": value not in self.values,
        }[self.op]


class SelectorError(ConfigError, ValueError):
    """Not a label selector; the message says which term and why."""


def _term(text: str) -> Term:
    if found := _SET.fullmatch(text):
        key, op, inside = found.groups()
        values = tuple(v.strip() for v in inside.split(","))
        return Term(key, op, values)
    for op in ("!=", "==", "="):
        if op in text:
            key, value = (part.strip() for part in text.split(op, 1))
            return Term(key, "!=" if op == "!=" else "=", (value,))
    if text.startswith("!"):
        return Term(text[1:].strip(), "!exists")
    return Term(text, "exists")


def parse_selector(selector: str) -> tuple[Term, ...]:
    """The terms of a Hetzner label selector; SelectorError names a term that is not one."""
    terms = []
    for text in (t.strip() for t in re.split(r",(?![^(]*\))", selector)):
        if not text:
            raise SelectorError(f"label selector {selector!r} has an empty term")
        term = _term(text)
        if not _KEY.fullmatch(term.key):
            raise SelectorError(f"{text!r} does not start with a label key such as sp00ky/agent")
        bad = [v for v in term.values if not _VALUE.fullmatch(v)]
        if bad:
            raise SelectorError(f"{text!r}: {bad[0]!r} is not a label value")
        terms.append(term)
    return tuple(terms)


def labels_matching(selector: str) -> dict[str, str]:
    """Labels that a selector matches (of an ``in`` set its first value), for a stand-in
    snapshot; a selector no labels can match gets labels it does not match."""
    labels: dict[str, str] = {}
    for term in parse_selector(selector):
        if term.op in ("=", "in"):
            labels[term.key] = term.values[0]
        elif term.op == "exists":
            labels[term.key] = ""
    return labels


def image_kind(value: str) -> ImageKind | None:
    """What ``machine.image`` names (the module docstring); None: none of the four."""
    if value == BAKED:
        return "baked"
    if value.isdigit():
        return "id"
    if _NAME.fullmatch(value):
        return "name"
    try:
        terms = parse_selector(value)
    except SelectorError:
        return None
    plain = len(terms) == 1 and terms[0].op == "exists" and "/" not in value
    return None if plain else "selector"  # a bare word would be a mistyped name


def has_docker(value: str) -> bool | None:
    """Whether the image has Docker: known for the images above, None for any other (a
    snapshot is whatever was saved in it)."""
    known = KNOWN_IMAGES.get(value)
    return None if known is None else known.docker
