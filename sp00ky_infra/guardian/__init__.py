"""The guardian: a run-once cron against the Hetzner API that trusts nobody (``passes``),
and its systemd timer on an operations host (``install``)."""

from sp00ky_infra.guardian.errors import GuardianError, Incomplete
from sp00ky_infra.guardian.passes import (
    PassReport,
    destroy_project,
    iter_plan_lines,
    run_pass,
)

__all__ = [
    "GuardianError",
    "Incomplete",
    "PassReport",
    "destroy_project",
    "iter_plan_lines",
    "run_pass",
]
