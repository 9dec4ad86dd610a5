"""A pool's baked snapshot: what it is made of (its recipe), the labels it carries, and the
label selectors that find it.

A snapshot is the pool's base image with Docker, the pinned agent and the backend's image
already on its disk. Its recipe is those three: the base image it was made from, the agent
archive's sha256 (``cloud_init.agent_sha256``) and the backend image's pinned reference (a
registry digest or an image id). The recipe's short hash is the snapshot's ``sp00ky/recipe``
label: the same recipe finds the same snapshot, so it is baked once and reused until one of
the three changes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from sp00ky_infra.shared import labels

HASH_LENGTH = 16  # hex digits: 64 bits, plenty for a project's few recipes


@dataclass(frozen=True, slots=True)
class Recipe:
    """What a baked snapshot is made of."""

    base: str  # the Hetzner image it starts from, e.g. debian-12
    agent_sha256: str  # the agent archive's (shared/cloud_init.agent_sha256)
    image: str  # the backend's image, pinned: NAME@sha256:... or an image id sha256:...

    @property
    def hash(self) -> str:
        """A short hash of the three, the same on every machine and run."""
        text = json.dumps([self.base, self.agent_sha256, self.image], separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:HASH_LENGTH]

    def labels(self, project: str, pool: str) -> dict[str, str]:
        """The snapshot's labels: whose it is and which recipe it holds."""
        return {**pool_labels(project, pool), labels.RECIPE: self.hash}

    def selector(self, project: str, pool: str) -> str:
        """The label selector of this recipe's snapshot of the pool."""
        return labels.selector(self.labels(project, pool))


def pool_labels(project: str, pool: str) -> dict[str, str]:
    """The labels every snapshot of the pool carries, whatever its recipe."""
    return {labels.PROJECT: project, labels.POOL: pool, labels.ROLE: "snapshot"}


def pool_selector(project: str, pool: str) -> str:
    """The label selector of every snapshot of the pool, whatever its recipe."""
    return labels.selector(pool_labels(project, pool))
