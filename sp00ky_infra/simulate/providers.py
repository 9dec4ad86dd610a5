"""What the simulator assumes of each provider: how long a machine takes from being asked
for to being ready, how often a boot fails, and how long its agent takes to restart the
backend between jobs (recycle: job) and to leave after a drain.

The defaults, and where they come from:

- ``hetzner``: about a minute. The Machine pools docs, "Boot time": "About a minute on Sp00ky
  Cloud from the scheduler asking to the machine being ready (the VM boots, installs the
  agent, downloads and starts your backend's image)". Drawn as normal(60 s, 15 s).
- ``docker``: "a couple of seconds under spky dev" (the same section): normal(3 s, 1 s).
- ``local``: agent and backend as processes on this host; measured here by the
  faithful-to-real test (tests/simulate/test_simulate_faithful.py), about 1 to 2 s: normal(1.5 s,
  0.3 s).
- Failed boots: no provider publishes a rate; the default is 0 (give ``--failure-rate``).
- Recycle and drain: the agent restarts (recycle) or stops (drain) the backend's process or
  container: under a second for a process, about a second for a container.
- Billing: Hetzner bills every started hour (``policy.cost``), so an idle surplus machine of
  a pool that keeps paid hours drains as its hour ends; local and docker machines cost
  nothing and drain at idleTimeout.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sp00ky_infra.policy.cost import HOUR
from sp00ky_infra.simulate.workload import Distribution


@dataclass(frozen=True, slots=True)
class ProviderModel:
    name: str
    boot: Distribution
    failure_rate: float = 0.0  # share of boots that fail (the backend never becomes ready)
    recycle: float = 0.0  # seconds a machine takes no job after its last one (recycle: job)
    drain: float = 0.0  # seconds from being told to drain (and idle) to its agent leaving
    billing_hour: float | None = None  # machines billed per started hour of this; None: free

    def with_(self, **changes: object) -> ProviderModel:
        return replace(self, **changes)  # type: ignore[arg-type]


PROVIDERS = {
    "hetzner": ProviderModel("hetzner", Distribution("normal", 60.0, 15.0), 0.0, 1.0, 1.0, HOUR),
    "docker": ProviderModel("docker", Distribution("normal", 3.0, 1.0), 0.0, 1.0, 1.0),
    "local": ProviderModel("local", Distribution("normal", 1.5, 0.3), 0.0, 0.3, 0.2),
}
