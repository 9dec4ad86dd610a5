"""The Pulumi program (`pulumi up`): sp00ky.yml's pools as firewalled Hetzner servers whose
cloud-init installs the agent, or (provider docker) as containers on the local engine.

The only module that reads Pulumi config (namespace ``sp00ky``):
  configFile  path to sp00ky.yml (default: sp00ky.yml beside this file)
  provider    hetzner | docker (default: hetzner)
  machines    {pool: [machine names]}: what exists; the controller writes it
  poolUrl     the scheduler's pool listener, as a machine reaches it
  poolSecret  (secret) SPKY_POOL_SECRET: signs the machines' join tokens
  project     the sp00ky/project label (default: the Pulumi project's name)
"""

import pulumi

from sp00ky_infra.config import ConfigInvalid
from sp00ky_infra.config.loader import load_config
from sp00ky_infra.config.model import DEFAULT_CONFIG_FILE
from sp00ky_infra.infra.program import build

settings = pulumi.Config("sp00ky")
provider = settings.get("provider") or "hetzner"
if provider not in ("hetzner", "docker"):
    raise pulumi.RunError(f"sp00ky:provider is {provider!r}; use hetzner or docker")
try:
    config = load_config(settings.get("configFile") or DEFAULT_CONFIG_FILE)
except ConfigInvalid as exc:
    raise pulumi.RunError(str(exc)) from exc

components = build(
    config,
    provider=provider,
    machines=settings.get_object("machines") or {},
    pool_url=settings.require("poolUrl"),
    pool_secret=settings.require("poolSecret"),  # signs join tokens; user-data is secret
    project=settings.get("project") or pulumi.get_project(),
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
