"""The guardian's heartbeat format: the scheduler stamps a unix time in a label of a small
cloud resource the stacks do not manage; the guardian reads it. Pure: the stamping and the
reading over the Hetzner API are ``sp00ky_infra.hetzner.heartbeat``'s.
"""

from __future__ import annotations

from collections.abc import Mapping

from sp00ky_infra.shared import labels


def stamp_labels(project: str, now: float) -> dict[str, str]:
    """The labels of a project's heartbeat resource, stamped at ``now``."""
    return {labels.PROJECT: project, labels.HEARTBEAT: str(int(now)), labels.ROLE: "heartbeat"}


def read_stamp(found: Mapping[str, str]) -> tuple[str, float]:
    """(project, unix time) from a heartbeat resource's labels; KeyError or ValueError when
    they are missing or malformed."""
    return found[labels.PROJECT], float(found[labels.HEARTBEAT])
