"""Where machines come from, behind one port: ``local`` (agent subprocesses), ``docker``."""

from __future__ import annotations

from sp00ky_infra.controller.provisioners.base import (
    MachineSpec,
    Provisioned,
    Provisioner,
    ProvisionerError,
    Refused,
)

__all__ = ["MachineSpec", "Provisioned", "Provisioner", "ProvisionerError", "Refused"]
