"""The Pulumi program (`pulumi up`): sp00ky.yml's pools as firewalled Hetzner servers whose
cloud-init installs the agent, or (provider docker) as containers on the local engine.

The only module that reads Pulumi config (namespace ``sp00ky``):
  configFile  path to sp00ky.yml (default: sp00ky.yml beside this file)
  provider    hetzner | docker (default: hetzner)
  machines    {pool: {machine: revision}}: what exists; the controller writes it. A run
              that is not the controller's (a `pulumi up` by hand) also keeps every machine
              of the project that exists, and refuses when it cannot list them
  poolUrl     the scheduler's pool listener, as a machine reaches it
  poolSecret  (secret) SPKY_POOL_SECRET: signs the machines' join tokens
  project     the sp00ky/project label (default: the Pulumi project's name)
  images      {pool: image}: what a pool with machine.image: baked boots, its snapshot's
              label selector once the controller has baked it (default: docker-ce)
"""

import os

import pulumi

from sp00ky_infra.config import ConfigInvalid
from sp00ky_infra.config.loader import load_config
from sp00ky_infra.config.model import DEFAULT_CONFIG_FILE
from sp00ky_infra.infra.existing import CannotTell, machines_for_run
from sp00ky_infra.infra.program import build
from sp00ky_infra.shared.desired import Desired, DesiredError, updated_by

settings = pulumi.Config("sp00ky")
provider = settings.get("provider") or "hetzner"
if provider not in ("hetzner", "docker"):
    raise pulumi.RunError(f"sp00ky:provider is {provider!r}; use hetzner or docker")
# Beside this file, whatever the process's directory: the controller runs this program in its
# own process, where the directory is its own, not the project's as under the pulumi CLI.
here = os.path.dirname(os.path.abspath(__file__))
try:
    config = load_config(os.path.join(here, settings.get("configFile") or DEFAULT_CONFIG_FILE))
except ConfigInvalid as exc:
    raise pulumi.RunError(str(exc)) from exc

project = settings.get("project") or pulumi.get_project()
try:
    machines, kept = machines_for_run(
        Desired.parse(settings.get_object("machines")),
        provider,
        project,
        updated_by(),
    )
except (DesiredError, CannotTell) as exc:
    raise pulumi.RunError(
        f"{exc}. Only the sp00ky-infra controller takes this stack's machines away; a run by "
        "hand keeps every machine that exists, so it must be able to list them"
    ) from exc
if kept:
    pulumi.log.warn(
        f"kept {len(kept)} machine(s) that exist but that sp00ky:machines here does not list "
        f"({', '.join(kept)}): only the controller takes machines away"
    )
components = build(
    config,
    provider=provider,
    machines=machines,
    pool_url=settings.require("poolUrl"),
    pool_secret=settings.require("poolSecret"),  # signs join tokens; user-data is secret
    project=project,
    images=settings.get_object("images") or {},
)
pulumi.export("pools", {name: component.urn for name, component in components.items()})
# The controller's pulumi provisioner writes these ids back on its machine rows.
pulumi.export(
    "machines",
    {
        name: resource.id
        for component in components.values()
        for name, resource in {
            **getattr(component, "machines", {}),
            **getattr(component, "containers", {}),
        }.items()
    },
)
