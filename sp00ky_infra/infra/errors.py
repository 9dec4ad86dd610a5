"""Errors of the infra package (the Pulumi components and the machine dynamic provider).

InfraError (root)
├── MachineError   no location or server type could take the machine, or the API refused it
│                  (machine.py)
└── CannotTell     a run by hand could not list the machines that exist, so it refuses
                   (existing.py)

The Hetzner API's own failures stay ``HcloudError`` (``sp00ky_infra.hetzner``): the client's root.
"""

from __future__ import annotations


class InfraError(Exception):
    """The infrastructure could not be brought to the desired state; the message says why."""
